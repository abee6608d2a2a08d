"""Multi-head latent attention (DeepSeek-V2): parity with transformers' DeepSeek-V3 attention, the
cache's bytes per token against the formula and the other layouts, and its refusals. Cached
decoding, head analysis and learning run over it with the other variants (tests/variants.py)."""

import pytest
import torch
from transformers import DeepseekV3Config
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

from nanoattn import GPT, ModelConfig
from nanoattn.generate import Decoding
from nanoattn.model import KVCache
from nanoattn.model.latent import LatentAttention
from nanoattn.positional import build_positional

RANK, ROPE = 16, 8


def perturbed(module: torch.nn.Module) -> torch.nn.Module:
    with torch.no_grad():  # norm gains off 1, so a swapped norm cannot hide
        for name, p in module.named_parameters():
            if "norm" in name:
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.2)
    return module


@pytest.mark.parametrize("q_rank", [None, 24], ids=["full-queries", "low-rank-queries"])
def test_latent_attention_equals_transformers_deepseek_v3_eager(q_rank):
    torch.manual_seed(0)
    T = 40
    cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=4, max_seq_len=T, norm_eps=1e-6, mla_kv_rank=RANK,
                      mla_q_rank=q_rank, mla_rope_dim=ROPE)
    ours = perturbed(LatentAttention(cfg)).eval()
    hf_cfg = DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                              q_lora_rank=q_rank, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                              qk_nope_head_dim=16, v_head_dim=16,
                              rope_interleave=False, attention_bias=False, num_hidden_layers=1,
                              max_position_embeddings=T)
    hf_cfg._attn_implementation = "eager"
    theirs = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
    names = {"kv_a.weight": "kv_a_proj_with_mqa.weight", "kv_norm.weight": "kv_a_layernorm.weight",
             "kv_b.weight": "kv_b_proj.weight", "proj.weight": "o_proj.weight",
             "q_proj.weight": "q_proj.weight", "q_a.weight": "q_a_proj.weight",
             "q_norm.weight": "q_a_layernorm.weight", "q_b.weight": "q_b_proj.weight"}
    theirs.load_state_dict({names[key]: value for key, value in ours.state_dict().items()}, strict=True)
    x = torch.randn(2, T, 64)
    positions = torch.arange(T)
    with torch.no_grad():
        cos_sin = DeepseekV3RotaryEmbedding(hf_cfg)(x, positions[None])
        causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
        expected, their_weights = theirs(x, position_embeddings=cos_sin, attention_mask=causal)
        got, weights = ours(x, build_positional(cfg), positions, T, return_weights=True)
        fast, _ = ours(x, build_positional(cfg), positions, T)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, their_weights, atol=1e-6, rtol=1e-5)


def test_the_cache_holds_the_latent_and_the_shared_rotary_key_only():
    """(mla_kv_rank + mla_rope_dim) numbers per token and layer, against 2 * n_kv_head * head_dim."""
    layers, heads, head_dim = 4, 8, 32
    base = dict(d_model=heads * head_dim, n_layer=layers, n_head=heads)
    layouts = {"MHA": dict(n_kv_head=8), "GQA-2": dict(n_kv_head=2), "MQA": dict(n_kv_head=1),
               "MLA": dict(n_kv_head=8, mla_kv_rank=64, mla_rope_dim=16)}
    per_token = {name: KVCache(ModelConfig(**base, **fields), 1, 64).bytes_per_token()
                 for name, fields in layouts.items()}
    assert per_token["MHA"] == 4 * layers * 2 * heads * head_dim == 8 * per_token["MQA"]  # float32
    assert per_token["MLA"] == 4 * layers * (64 + 16)
    assert per_token["MHA"] / per_token["MLA"] == 6.4 and per_token["GQA-2"] / per_token["MLA"] == 1.6
    cfg = ModelConfig(**base, n_kv_head=8, mla_kv_rank=64, mla_rope_dim=16, vocab_size=50)
    decoding = Decoding(GPT(cfg).eval(), torch.zeros(2, 3, dtype=torch.long), 5, temperature=0)
    for _ in decoding:
        pass
    assert decoding.cache.nbytes == 2 * 8 * per_token["MLA"]  # batch 2 x 8 slots


@pytest.mark.parametrize(("fields", "message"), [
    (dict(pos="alibi"), "model.pos='alibi' is invalid: must be 'rope' with mla_kv_rank"),
    (dict(n_kv_head=2), "model.n_kv_head=2 is invalid: must be 4 with mla_kv_rank"),
    (dict(rope_scaling={"type": "yarn", "factor": 4.0}),
     "model.rope_scaling=.* must be None with mla_kv_rank"),
    (dict(qk_norm="before_rope"), "model.qk_norm='before_rope' is invalid: must be 'none'"),
    (dict(mla_rope_dim=7), "model.mla_rope_dim=7 is invalid: must be even"),
    (dict(mla_kv_rank=0), "model.mla_kv_rank=0 is invalid"),
    (dict(mla_q_rank=-1), "model.mla_q_rank=-1 is invalid"),
    (dict(mla_kv_rank=None, mla_q_rank=8), "model.mla_q_rank=8 is invalid: needs mla_kv_rank"),
])
def test_latent_attention_refuses_what_it_is_not_defined_for(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        ModelConfig(**{"d_model": 64, "n_head": 4, "n_kv_head": 4, "mla_kv_rank": 16, **fields})
    assert "\n" not in str(info.value)
