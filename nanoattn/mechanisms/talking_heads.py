"""Talking-heads attention (``talking_heads``): Shazeer, Lan, Cheng, Ding and Hou 2020,
"Talking-Heads Attention" (arXiv:2003.02436).

The heads' logits are mixed across heads before the softmax and their weights after it:
L[h] = sum_g P_l[g, h] J[g] with J[g] = q_g . k_g / sqrt(d) for every query and key, W = softmax(L),
U[h] = sum_g P_w[g, h] W[g], and head h's output is U[h] V (V of its K/V group under GQA). This is
the paper's square form (h_k = h = h_v = n_head). Each query's row mixes only its own scores, so the
KV cache needs nothing and cached decoding is exact; SDPA never exposes the scores, so attention
computes them explicitly in query chunks. P_l and P_w start as the identity, so training starts from
plain attention (the paper's equations fix no start; this is this module's choice). The logits mixed
are q.k / sqrt(d): an encoding's additive bias joins each head's mixed logits after the mix.

Statistic: per layer and mixed head, the share of its column of |P| that comes from other heads, for
P_l (``logits``) and P_w (``weights``), and their ``mean`` (0: plain attention).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_bool


class TalkingHeads(Mechanism):
    fields = ("talking_heads",)
    attribute = "talking_heads"
    sdpa_computes = False
    mixes_heads = True
    paired_heads_refusal = ("it mixes the scores of all heads, and differential attention computes the two "
                            "halves of its pairs in separate passes")

    def __init__(self, cfg, layer: int) -> None:
        super().__init__(cfg, layer)
        self.logits_mix = nn.Parameter(torch.eye(cfg.n_head))  # P_l [from head g, to head h]
        self.weights_mix = nn.Parameter(torch.eye(cfg.n_head))  # P_w

    @classmethod
    def check_config(cls, cfg) -> None:
        check_bool("model", "talking_heads", cfg.talking_heads)

    def scores(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bgqk,gh->bhqk", scores, self.logits_mix.to(scores.dtype))

    def weights(self, weights: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bgqk,gh->bhqk", weights, self.weights_mix.to(weights.dtype))

    @classmethod
    def statistic(cls, layers: list[TalkingHeads], seq_len: int) -> dict[str, Any]:
        def off_diagonal(mix: torch.Tensor) -> list[float]:
            size = mix.detach().abs().float()
            return (1 - size.diagonal() / size.sum(0).clamp(min=1e-30)).tolist()  # [heads]: per mixed head

        logits = [off_diagonal(layer.logits_mix) for layer in layers]
        weights = [off_diagonal(layer.weights_mix) for layer in layers]
        return {"logits": logits, "weights": weights, "mean": float(torch.tensor([logits, weights]).mean())}

    @classmethod
    def headline(cls, statistic: dict[str, Any]) -> tuple[str, float]:
        return "share mixed", statistic["mean"]
