"""Exclusive self-attention (``xsa``): Zhai 2026 (arXiv:2603.09078).

z_i = y_i - (y_i . v_i / |v_i|^2) v_i: each head's output minus its projection on the token's own
value (with GQA, the value of the head's K/V group; with value embeddings, the mixed value the cache
holds). This is the paper's fixed form; modded-nanogpt's record (PR #264, "gated XSA") instead
learns a gate per layer and head on the subtracted projection, started at 0 (plain attention). It
acts on the heads' outputs, so the maps are unchanged and the cache needs nothing (the newest
values are the tokens' own).

Statistic: ``removed`` per layer and query head, cos^2 between each output y_i and the token's value
v_i, the share of |y_i|^2 that the exclusion takes out; and its ``mean``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_bool


class ExcludeSelf(Mechanism):
    fields = ("xsa",)
    attribute = "exclude_self"
    paired_heads_refusal = ("a differential head is RMSNorm((A1 - lambda A2) V) over a pair of values, which "
                            "neither paper excludes one from")
    observes = True

    @classmethod
    def check_config(cls, cfg) -> None:
        check_bool("model", "xsa", cfg.xsa)

    def heads(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """y minus its projection on v, each group of H / Hkv query heads on its K/V head's value."""
        B, H, T, Dv = y.shape
        grouped = y.reshape(B, v.shape[1], -1, T, Dv)  # [B, Hkv, H / Hkv, T, Dv]
        unit = F.normalize(v, dim=-1)[:, :, None]  # [B, Hkv, 1, T, Dv]; 0 for a zero value
        along = (grouped * unit).sum(-1, keepdim=True)  # [B, Hkv, H / Hkv, T, 1]
        if self.first_query is not None:
            share = along.float().square() / grouped.float().square().sum(-1, keepdim=True).clamp(min=1e-30)
            self.observe(share.reshape(B, H, T))
        return (grouped - along * unit).view(B, H, T, Dv)

    @classmethod
    def statistic(cls, layers: list[ExcludeSelf], seq_len: int) -> dict[str, Any]:
        removed = torch.stack([layer.observed_mean() for layer in layers])  # [n_layer, n_head]
        return {"removed": removed.tolist(), "mean": float(removed.mean())}

    @classmethod
    def headline(cls, statistic: dict[str, Any]) -> tuple[str, float]:
        return "share removed", statistic["mean"]
