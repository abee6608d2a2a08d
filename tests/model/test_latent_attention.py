"""Multi-head latent attention (DeepSeek-V2): the cache's bytes per token against the formula and the
other layouts, and its refusals. Parity with transformers' DeepSeek-V3 attention is a reference
check (nanoattn/references); cached decoding, head analysis and learning run over it with the
other variants (tests/variants.py)."""

import pytest
import torch

from nanoattn import GPT, ModelConfig
from nanoattn.generate import Decoding
from nanoattn.model import KVCache


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
