"""AdamW parameter groups and learning-rate schedules.

Design choices:
- Weight decay applies to matmul weights only. Norm gains, biases and embeddings (token and
  learned-position tables) are not decayed unless ``decay_embeddings`` asks for the embeddings:
  decaying a gain pulls it towards 0, not towards "no effect", and an embedding row is only
  updated when its token occurs, so decay would shrink rare tokens most. A tied LM head is the
  token embedding and follows it.
- Groups are found by shape and module type, not by parameter name, so a new layer needs no new
  naming rule: 1-D parameters are norm gains and biases, ``nn.Embedding`` weights are embeddings.
- Schedules are pure functions of the step (``lr_at``): a resumed run recomputes the exact
  learning rate from the step alone, and nothing but the step needs saving for them.
- ``fused=True`` AdamW where the device has the kernel (CUDA, and CPU since torch 2.4): one kernel
  for all parameters instead of a loop of small ops.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def param_groups(model: nn.Module, weight_decay: float, *, decay_embeddings: bool = False) -> list[dict]:
    """Two AdamW groups: {"params": decayed, "weight_decay": weight_decay} and {..., 0.0}.

    Every parameter appears exactly once (tied weights included).
    """
    no_decay: set[int] = set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.ndim < 2 or (isinstance(module, nn.Embedding) and not decay_embeddings):
                no_decay.add(id(p))
    decay, keep = [], []
    for p in model.parameters():  # deduplicated: a tied head is listed once, as the embedding
        if p.requires_grad:
            (keep if id(p) in no_decay else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                   decay_embeddings: bool, device: torch.device) -> torch.optim.AdamW:
    groups = param_groups(model, weight_decay, decay_embeddings=decay_embeddings)
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int, schedule: str,
          decay_fraction: float = 0.2) -> float:
    """The learning rate of optimizer update ``step`` (0-based, < max_steps).

    - warmup: linear, lr * (step + 1) / warmup_steps for the first ``warmup_steps`` updates;
    - cosine: then half a cosine from lr down to min_lr at the last update;
    - wsd: then lr held constant until the last ``decay_fraction * max_steps`` updates, which
      decay to min_lr with the "1 - sqrt" shape (Hägele et al. 2024, arXiv:2405.18392, found it
      better than a linear cooldown; 20% of training matches cosine);
    - constant: then lr.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = max(1, max_steps - 1 - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)
    if schedule == "wsd":
        decay_steps = max(1, round(decay_fraction * max_steps))
        decay_start = max(warmup_steps, max_steps - decay_steps)
        if step < decay_start:
            return lr
        progress = min(1.0, (step - decay_start + 1) / (max_steps - decay_start))
        return min_lr + (1 - math.sqrt(progress)) * (lr - min_lr)
    raise ValueError(f"train.schedule={schedule!r} is invalid: allowed: cosine | wsd | constant")
