"""ModelConfig validation, presets and the seed documents' parameter counts."""

import pytest
import torch

from nanoattn import GPT, ModelConfig, preset
from nanoattn.model import Attention


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_gpt2_small_attention_is_4d2_plus_4d_per_layer():
    cfg = preset("gpt2-small")
    attn = Attention(cfg)
    d = cfg.d_model
    assert 4 * d * d == 2_359_296
    assert count(attn) == 4 * d * d + 4 * d == 2_362_368


def test_gpt2_small_and_llama_7b_totals_on_meta_device():
    with torch.device("meta"):
        gpt2 = GPT(preset("gpt2-small"))
        llama = GPT(preset("llama-7b"))
    assert gpt2.num_params() == 124_439_808
    assert llama.num_params() == 6_738_415_616
    assert llama.cfg.ffn_dim == 11008  # 8/3 * 4096 rounded up to a multiple of 256
    assert next(llama.parameters()).device.type == "meta"


@pytest.mark.parametrize("d_model,n_head", [(768, 12), (512, 8), (4096, 32), (512, 4)])
def test_head_dim_is_d_model_over_n_head(d_model, n_head):
    assert ModelConfig(d_model=d_model, n_head=n_head).head_dim == d_model // n_head


@pytest.mark.parametrize("n_kv_head", [8, 4, 2, 1])
def test_mha_gqa_mqa_attention_parameter_counts(n_kv_head):
    d, n_head = 512, 8
    hd = d // n_head
    attn = Attention(ModelConfig(d_model=d, n_head=n_head, n_kv_head=n_kv_head, bias=False))
    # W_Q and W_O are d x d; W_K and W_V shrink to d x (n_kv_head * head_dim).
    assert count(attn) == 2 * d * d + 2 * d * n_kv_head * hd
    if n_kv_head == n_head:
        assert count(attn) == 4 * d * d


def test_flops_per_token_follows_the_palm_formula():
    cfg = ModelConfig(vocab_size=100, d_model=64, n_layer=2, n_head=4, d_ff=128, tie_embeddings=False)
    model = GPT(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert linear == 2 * (64 * 192 + 64 * 64 + 64 * 256 + 128 * 64) + 100 * 64
    assert model.flops_per_token(32) == 6 * linear + 12 * 2 * 4 * 16 * 32


@pytest.mark.parametrize(
    "overrides,field",
    [
        (dict(n_head=8, n_kv_head=3), "n_kv_head"),
        (dict(d_model=100, n_head=8), "d_model"),
        (dict(pos="bogus"), "pos"),
        (dict(d_model=36, n_head=4, pos="rope"), "d_model"),  # head_dim 9 is odd
        (dict(d_model=0), "d_model"),
        (dict(n_layer=-1), "n_layer"),
        (dict(vocab_size=0), "vocab_size"),
        (dict(max_seq_len=0), "max_seq_len"),
        (dict(n_kv_head=0), "n_kv_head"),
        (dict(d_ff=0), "d_ff"),
        (dict(dropout=1.0), "dropout"),
        (dict(dropout=-0.1), "dropout"),
        (dict(norm="batchnorm"), "norm"),
        (dict(mlp="relu"), "mlp"),
        (dict(pos="alibi", rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling"),
    ],
)
def test_bad_config_names_the_field(overrides, field):
    with pytest.raises(ValueError, match=rf"model\.{field}") as err:
        ModelConfig(**overrides)
    assert "\n" not in str(err.value)


def test_odd_head_dim_is_fine_without_rope():
    assert ModelConfig(d_model=36, n_head=4, pos="alibi").head_dim == 9


def test_from_dict_names_unknown_keys():
    with pytest.raises(ValueError, match=r"model\.n_heads"):
        ModelConfig.from_dict({"n_heads": 4})


def test_unknown_preset():
    with pytest.raises(ValueError, match="gpt5"):
        preset("gpt5")


def test_defaults():
    cfg = ModelConfig()
    assert cfg.n_kv_head == cfg.n_head
    assert ModelConfig(mlp="gelu", d_model=64).ffn_dim == 256


def test_the_relu2_mlp_is_two_matrices_of_4x_width_with_relu_squared_between():
    cfg = ModelConfig(vocab_size=16, d_model=8, n_layer=1, n_head=2, mlp="relu2")
    mlp = GPT(cfg).blocks[0].mlp
    assert cfg.ffn_dim == 32 and mlp.up.weight.shape == (32, 8) and mlp.down.weight.shape == (8, 32)
    x = torch.randn(3, 8)
    expected = torch.clamp(x @ mlp.up.weight.T, min=0) ** 2 @ mlp.down.weight.T
    torch.testing.assert_close(mlp(x), expected)
