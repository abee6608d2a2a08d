"""Random models with every weight moved off its initial value (so a mapping error cannot hide behind
zeros or ones), their inputs, transformers' model loaded from an export, and each attention variant's
fields at the size of these small models."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from nanoattn import GPT, ModelConfig
from nanoattn.config.options import ATTENTION_VARIANTS

VOCAB = 97
ORIGINAL = 32  # RoPE models' training context
LONG = 80  # the evaluation length: 2.5x past it
BASE = dict(vocab_size=VOCAB, d_model=64, n_layer=4, n_head=4, n_kv_head=2, d_ff=96, max_seq_len=ORIGINAL,
            norm="rmsnorm", mlp="swiglu")
GPT2 = dict(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4, max_seq_len=LONG, pos="learned",
            norm="layernorm", mlp="gelu", bias=True)


def perturb_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Add N(0, 0.1) to every parameter: norm weights become 1 +- 0.1, biases +- 0.1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return module.eval()


def model(**fields) -> GPT:
    torch.manual_seed(0)
    return perturb_(GPT(ModelConfig(**fields)))


def tokens(length: int = LONG, batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(1))


def load_transformers(path: Path, attn_implementation: str = "eager", **overrides):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                attn_implementation=attn_implementation, **overrides).eval()


def logits_diff(ours: GPT, theirs, length: int = LONG) -> float:
    idx = tokens(length)
    with torch.no_grad():
        return (ours(idx) - theirs(idx).logits).abs().max().item()


# These models are smaller than the labs' (2 to 4 layers, 16 to 80 tokens, random weights), so the
# variants whose values are sized for the labs take values that act at this size: a window shorter
# than the input, caps where tanh is far from linear on random scores and logits, latent ranks below
# d_model, one value table for two layers.
AT_TEST_SIZE = {
    "softcap": dict(attn_softcap=1.5, logit_softcap=1.5),
    "window": dict(sliding_window=6),
    "local_global": dict(sliding_window=[6, None]),  # a local layer of window 6, then a global one
    "mla": dict(mla_kv_rank=12, mla_q_rank=20, mla_rope_dim=4),
    "value_embeds": dict(value_embeds=1),  # one table, shared by the first and the last layer
}


def at_test_size(name: str) -> dict:
    """The registry's fields of variant ``name``, with the test-sized values above."""
    return {**ATTENTION_VARIANTS[name], **AT_TEST_SIZE.get(name, {})}


