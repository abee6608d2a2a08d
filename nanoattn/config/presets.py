"""The named model presets: the one source of their shapes. The scripts register them as Hydra's
``model`` group (a YAML file in ``configs/model/`` adds one of your own); tests count their parameters."""

from __future__ import annotations

from typing import Any

from nanoattn.config.model import ModelConfig

PRESETS: dict[str, dict[str, Any]] = {
    # GPT-2 small (Radford et al. 2019): 124,439,808 parameters with tied embeddings.
    "gpt2-small": dict(vocab_size=50257, d_model=768, n_layer=12, n_head=12, max_seq_len=1024,
                       pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True),
    # The modern block at GPT-2 small's shape (RoPE, RMSNorm, SwiGLU at 8/3 of d_model, no biases, tied
    # embeddings), as the nanoGPT speedruns train it: 123,587,328 parameters with GPT-2's vocabulary
    # padded to a multiple of 128 (a training run fits vocab_size to its tokenizer).
    "llama-124m": dict(vocab_size=50304, d_model=768, n_layer=12, n_head=12, d_ff=2048, max_seq_len=1024,
                       pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=True),
    # LLaMA-7B shape (Touvron et al. 2023): 6,738,415,616 parameters.
    "llama-7b": dict(vocab_size=32000, d_model=4096, n_layer=32, n_head=32, max_seq_len=2048,
                     pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False,
                     norm_eps=1e-6),
    # CPU-sized presets (the defaults of the Hydra configs).
    "gpt-tiny": dict(vocab_size=2048, d_model=128, n_layer=4, n_head=4, d_ff=512, max_seq_len=256,
                     pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True),
    "llama-tiny": dict(vocab_size=2048, d_model=128, n_layer=4, n_head=4, n_kv_head=2, d_ff=384,
                       max_seq_len=256, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                       tie_embeddings=True),
    "llama-small": dict(vocab_size=4096, d_model=384, n_layer=6, n_head=6, n_kv_head=2, d_ff=1024,
                        max_seq_len=256, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                        tie_embeddings=False),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A ModelConfig from a named preset, with field overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; allowed: {' | '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
