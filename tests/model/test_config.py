"""ModelConfig validation, presets and the seed documents' parameter counts."""

import dataclasses
import math
import re

import pytest
import torch

from nanoattn import GPT, ModelConfig, preset
from nanoattn.config import DataConfig, LoggerConfig, RunConfig, TaskConfig, TokenizerConfig, TrainConfig
from nanoattn.model import Attention
from nanoattn.positional import REGISTRY, encodings_with


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
        modern = GPT(preset("llama-124m"))
        llama = GPT(preset("llama-7b"))
    assert gpt2.num_params() == 124_439_808
    # GPT-2 small's shape in the modern block: SwiGLU's three matrices at 8/3 of d_model hold what GELU's two
    # at 4x do, no biases, RoPE for the learned table, the vocabulary padded to 50,304.
    assert modern.num_params() == 123_587_328 and modern.cfg.ffn_dim == 2048
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


# ----------------------------------------------------------------------------- rules by capability
# Every rule that depends on what an encoding does asks ModelConfig.rotary / length_limit, which ask
# the registry's flags; these tests hold the flags to what the encodings do.


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_learned_length_is_exactly_the_encodings_undefined_past_max_seq_len(name):
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layer=2, n_head=2, max_seq_len=16, pos=name)
    pos = GPT(cfg).pos
    pos.check_length(16)
    if REGISTRY[name].learned_length:
        assert cfg.length_limit == 16
        with pytest.raises(ValueError):
            pos.check_length(17)
    else:
        assert cfg.length_limit is None
        pos.check_length(64)


IROPE = ["rope", "rope", "rope", "nope"]


@pytest.mark.parametrize("pos,rotary", [
    ("rope", True), ("xpos", True), (IROPE, True), (["alibi", "xpos"], True), ("alibi", False),
    (["nope", "alibi"], False)])
def test_rotary_is_true_when_some_layer_rotates(pos, rotary):
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layer=4, n_head=2, max_seq_len=16, pos=pos)
    assert cfg.rotary is rotary
    assert {"rope", "xpos"} <= set(encodings_with("rotary")) == {n for n, c in REGISTRY.items() if c.rotary}


def test_a_run_longer_than_a_learned_length_is_refused_and_any_other_run_is_not():
    with pytest.raises(ValueError, match=r"^train.seq_len=32 is invalid: must be at most "
                                         r"model.max_seq_len=16 with pos='learned'"):
        RunConfig(model={"pos": "learned", "max_seq_len": 16}, train={"seq_len": 32})
    for name in (n for n, cls in REGISTRY.items() if not cls.learned_length):
        assert RunConfig(model={"pos": name, "max_seq_len": 16}, train={"seq_len": 32}).seq_len == 32


# ----------------------------------------------------------------------------- every field validated
# Values of a wrong type for each annotation a config field has, so the cases follow the dataclasses:
# a field of a new annotation fails collection here (KeyError) until its wrong values are added.
WRONG_TYPE: dict[str, tuple] = {
    "int": ("4", 2.5, True), "int | None": ("4", 2.5, True),
    "float": ("0.5", True, None), "float | None": ("0.5", True),
    "bool": ("yes", 1, None), "bool | str": ("yes", 1, None), "str": (1, None), "str | None": (1, ["a"]),
    "list[str]": ("a.txt", [1]),
    "dict[str, Any] | None": ("linear", [2.0]), "list[int] | None": ("0123456789", [1.5] * 10),
    **{section: (1,) for section in ("TokenizerConfig", "ModelConfig", "DataConfig", "TrainConfig",
                                     "LoggerConfig", "TaskConfig")},
}
WRONG_ANY = {"pos": (1, {"rope": 1}), "sliding_window": ("64", 2.5, b"x"), "resume": (1, None)}  # by name
CONFIGS = {ModelConfig: "model", TokenizerConfig: "data.tokenizer", DataConfig: "data", TrainConfig: "train",
           TaskConfig: "task", LoggerConfig: "logger", RunConfig: "run"}


def _cases(wrong):
    return [pytest.param(cls, f.name, value, id=f"{owner}.{f.name}={value!r}")
            for cls, owner in CONFIGS.items() for f in dataclasses.fields(cls) for value in wrong(f)]


@pytest.mark.parametrize("cls,name,value", _cases(lambda f: WRONG_ANY[f.name] if f.type == "Any"
                                                  else WRONG_TYPE[f.type]))
def test_every_config_field_refuses_a_value_of_a_wrong_type(cls, name, value):
    """ModelConfig and the run's sections: a bool, a string or None where a number belongs (or the
    reverse) is a one-line error naming the field, never a config that trains garbage."""
    with pytest.raises(ValueError, match=rf"^{re.escape(CONFIGS[cls])}\.{name}=.* is invalid: ") as err:
        cls(**{name: value})
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("cls,name,value", _cases(lambda f: (math.inf, -math.inf, math.nan)
                                                  if f.type.startswith("float") else ()))
def test_no_float_field_takes_a_non_finite_value(cls, name, value):
    with pytest.raises(ValueError, match=rf"^{re.escape(CONFIGS[cls])}\.{name}={value!r} is invalid: "):
        cls(**{name: value})


def test_ints_stand_for_floats_and_unused_fields_keep_their_own_rules():
    cfg = ModelConfig(rope_theta=500000, dropout=0, norm_eps=1, bias=True, tie_embeddings=False)
    assert (cfg.rope_theta, cfg.dropout, cfg.bias, cfg.tie_embeddings) == (500000, 0, True, False)
    assert TrainConfig(lr=1, grad_clip=0).min_lr == 0.1
    # An encoding's own rule applies when the model uses it; otherwise only the type and sign.
    assert ModelConfig(t5_num_buckets=1).t5_num_buckets == 1
    with pytest.raises(ValueError, match=r"^model.t5_num_buckets=1 is invalid: must be an integer >= 2"):
        ModelConfig(pos="t5", t5_num_buckets=1)
