"""Soft-capped scores (``attn_softcap``): Gemma Team 2024, "Gemma 2" (arXiv:2408.00118).

Each score q.k / sqrt(d) becomes cap * tanh(score / cap): smooth, odd, bounded by the cap, before an
encoding's bias is added (so an ALiBi or T5 bias keeps its full range) and before the mask. SDPA
cannot cap its scores, so attention computes them explicitly in query chunks; the cap acts on each
score alone, so cached decoding is exact. The same function caps the output logits
(``logit_softcap``, in ``GPT``), which is not an attention mechanism.
"""

from __future__ import annotations

import torch

from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_number


def softcap(x: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(x / cap); None leaves x as is."""
    return x if cap is None else cap * torch.tanh(x / cap)


class ScoreCap(Mechanism):
    fields = ("attn_softcap",)
    attribute = "score_cap"
    sdpa_computes = False

    def __init__(self, cfg, layer: int) -> None:
        super().__init__(cfg, layer)
        self.cap = cfg.attn_softcap

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.attn_softcap is not None:
            check_number("model", "attn_softcap", cfg.attn_softcap,
                         "must be a positive finite number or null (no capping)")
            cfg.attn_softcap = float(cfg.attn_softcap)

    def scores(self, scores: torch.Tensor) -> torch.Tensor:
        return softcap(scores, self.cap)
