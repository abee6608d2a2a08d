"""``encodings`` and ``attention``: the price of each positional encoding and attention variant in
training tokens/s, side by side.

- ``encodings``: every ``pos`` option (``nanoattn.config.options.encoding_options``: each registry
  encoding and the named forms, the iRoPE layout among them), as a ratio to RoPE's.
- ``attention``: every variant of ``nanoattn.config.options.ATTENTION_VARIANTS``, as a ratio to
  the plain block's, and the plain block on SDPA's kernel (``attn_kernel=sdpa``).
- Each model is the config's shape with random weights, trained through
  ``nanoattn.train.step.optimizer_step`` (the update the training loop runs), one repetition of
  each in turn (``alternate``), so load from other processes hits all alike and the ratios hold
  where absolute numbers do not. ``learned`` gets a table of the benchmark's length; every model
  has the same d_model, heads and depth, so the differences are the variants' own work
  (rotations, bias chunks, CoPE's gates, norms, the explicit capped scores).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from nanoattn.bench.core import BenchConfig, Row, alternate, random_tokens, section, shape_text
from nanoattn.config import TrainConfig
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.model import GPT
from nanoattn.runtime import autocast, autocast_dtype
from nanoattn.train.optim import optimizer_for
from nanoattn.train.step import optimizer_step, wrap_for_training


def bench_attention() -> dict[str, dict[str, Any]]:
    """The attention registry's variants on the config's own encoding ("plain" is the reference),
    and the plain block on SDPA's kernel: the same function, its kernel choice priced (attn_kernel=auto
    takes two bf16 matmuls on CPU in bf16 up to 1,024 keys where timed faster; elsewhere the two
    rows are one path)."""
    return {**ATTENTION_VARIANTS, "attn_kernel sdpa": dict(attn_kernel="sdpa")}


def _label(pos: str | list[str]) -> str:
    return pos if isinstance(pos, str) else "[" + ",".join(pos) + "]"


def _step_seconds(cfg: BenchConfig,
                  models: Mapping[str, dict[str, Any]]) -> tuple[dict[str, float], int, int]:
    """Median seconds per training step of each labelled model (ModelConfig overrides), alternated;
    and the batch and length they ran at."""
    device, t = cfg.torch_device(), TrainConfig()
    B, T = cfg.batch_size, 64 if cfg.quick else cfg.seq_len
    batch = (random_tokens(cfg.model.vocab_size, (B, T), device, seed=1),  # [B, T]
             random_tokens(cfg.model.vocab_size, (B, T), device, seed=2))
    amp, _ = autocast_dtype(cfg.dtype, device)
    steps = {}
    for label, overrides in models.items():
        torch.manual_seed(0)
        model_cfg = dataclasses.replace(cfg.model, max_seq_len=T, rope_scaling=None, **overrides)
        if model_cfg.abacus:  # the tokens are random: ten of them stand for the digits
            model_cfg = dataclasses.replace(model_cfg, abacus_digits=list(range(10)))
        with device:
            model = GPT(model_cfg).train()
        optimizer = optimizer_for(model, t, device)
        net = wrap_for_training(model, ddp=False, compile=False, device=device)
        steps[label] = (lambda net=net, model=model, optimizer=optimizer: optimizer_step(
            net, model, optimizer, [batch], grad_clip=t.grad_clip, autocast=lambda: autocast(device, amp)))
    return alternate(steps, cfg.reps, device), B, T


@section("encodings")
def encodings_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Training-step tokens/s of every encoding at one shape, and its ratio to RoPE's."""
    seconds, B, T = _step_seconds(cfg, encoding_options())
    rope = B * T / seconds["rope"]
    return [dict(pos=label, dtype=cfg.dtype, shape=shape_text(cfg.model, B, T), step_ms=1000 * s,
                 tok_per_s=B * T / s, vs_rope=B * T / s / rope) for label, s in seconds.items()]


@section("attention")
def attention_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Training-step tokens/s of every attention variant at one shape, and its ratio to the plain block's."""
    seconds, B, T = _step_seconds(cfg, bench_attention())
    plain = B * T / seconds["plain"]
    return [dict(variant=label, pos=_label(cfg.model.pos), dtype=cfg.dtype, shape=shape_text(cfg.model, B, T),
                 step_ms=1000 * s, tok_per_s=B * T / s, vs_plain=B * T / s / plain)
            for label, s in seconds.items()]
