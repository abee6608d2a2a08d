"""QK-norm (``qk_norm``): RMSNorm of every query and key head over head_dim, before the rotation (OLMo 2,
Qwen 3's q_norm / k_norm) or after it (nanochat), before the encoding's scale.

One gain vector for the queries and one for the keys, shared by the heads, from 1. Each head is
normalised on its own, so cached decoding is exact: the cache holds the keys as attention reads them.
The norm runs in its gains' dtype (torch's fused RMSNorm refuses bf16 heads with float32 gains) and
returns the heads' dtype. Latent attention makes its keys from a latent, so it refuses this (and
every mechanism that acts on the projections: ``config/variants.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_choice

PLACES = ("none", "before_rope", "after_rope")


class QKNorm(Mechanism):
    fields = ("qk_norm",)
    attribute = "qk_norm"

    def __init__(self, cfg, layer: int) -> None:
        super().__init__(cfg, layer)
        self.place = cfg.qk_norm
        self.q = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.k = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_choice("model", "qk_norm", cfg.qk_norm, PLACES)

    @classmethod
    def acts_after_rotation(cls, cfg) -> bool:
        return cfg.qk_norm == "after_rope"

    def normalised(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.q(q.to(self.q.weight.dtype)).to(q.dtype), self.k(k.to(self.k.weight.dtype)).to(k.dtype))

    def before_rotation(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.normalised(q, k) if self.place == "before_rope" else (q, k)

    def after_rotation(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.normalised(q, k) if self.place == "after_rope" else (q, k)
