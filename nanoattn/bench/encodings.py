"""``encodings``: the price of each positional encoding in training tokens/s, side by side.

- Every registered encoding, plus a RoPE/NoPE interleaving (a per-layer layout, as Llama 4's iRoPE
  and SmolLM3 use; 1:1 so it fits any depth >= 2), at the config's model shape with
  random weights, through ``nanoattn.train.step.optimizer_step`` (the update the training loop
  runs), one repetition of each in turn (``alternate``), so load from other processes hits all
  alike and the ratio to RoPE holds where absolute numbers do not.
- ``learned`` gets a table of the benchmark's length; every model has the same d_model, heads and
  depth, so the differences are the encodings' own work (rotations, bias chunks, CoPE's gates).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from nanoattn.bench.core import BenchConfig, Row, alternate, random_tokens, section, shape_text
from nanoattn.config import TrainConfig
from nanoattn.model import GPT
from nanoattn.positional import REGISTRY
from nanoattn.runtime import autocast, autocast_dtype
from nanoattn.train.optim import make_optimizer
from nanoattn.train.step import optimizer_step, wrap_for_training

# Registered encodings and a per-layer RoPE/NoPE layout, each a ``pos`` value.
BENCH_ENCODINGS: tuple[str | list[str], ...] = (*REGISTRY, ["rope", "nope"])


def _label(pos: str | list[str]) -> str:
    return pos if isinstance(pos, str) else "[" + ",".join(pos) + "]"


@section("encodings")
def encodings_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Training-step tokens/s of every encoding at one shape, and its ratio to RoPE's."""
    device, t = cfg.torch_device(), TrainConfig()
    B, T = cfg.batch_size, 64 if cfg.quick else cfg.seq_len
    batch = (random_tokens(cfg.model.vocab_size, (B, T), device, seed=1),  # [B, T]
             random_tokens(cfg.model.vocab_size, (B, T), device, seed=2))
    amp, _ = autocast_dtype(cfg.dtype, device)
    steps = {}
    for pos in BENCH_ENCODINGS:
        torch.manual_seed(0)
        with device:
            model = GPT(dataclasses.replace(cfg.model, pos=pos, max_seq_len=T, rope_scaling=None)).train()
        optimizer = make_optimizer(model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                                   decay_embeddings=t.decay_embeddings, device=device)
        net = wrap_for_training(model, ddp=False, compile=False, device=device)
        steps[_label(pos)] = (lambda net=net, model=model, optimizer=optimizer: optimizer_step(
            net, model, optimizer, [batch], grad_clip=t.grad_clip, autocast=lambda: autocast(device, amp)))
    seconds = alternate(steps, cfg.reps, device)
    rope = B * T / seconds["rope"]
    return [dict(pos=label, dtype=cfg.dtype, shape=shape_text(cfg.model, B, T), step_ms=1000 * s,
                 tok_per_s=B * T / s, vs_rope=B * T / s / rope) for label, s in seconds.items()]
