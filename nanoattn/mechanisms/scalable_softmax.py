"""Scalable-Softmax (``ssmax``): Nakanishi 2025, "Scalable-Softmax Is Superior for Attention"
(arXiv:2501.19399).

The softmax over n logits z becomes softmax((s log n) z), s learned per head and layer, n the keys
the query sees: position + 1 under the causal mask, at most the window in a windowed layer
(position = slot in a streaming cache, which is the same count). The paper's implementation scales
the query by s log n, which is what this does, so SDPA's kernels still serve and the KV cache is
untouched: a query's factor depends on its own position only, so cached decoding is exact. s starts
at 1 / log(max_seq_len): the plain softmax at the training length, sharper past it (the paper learns
s; its starting value is this module's choice). Llama 4's query temperature
(``temperature_floor_scale``, ``positional/nope.py``) is a fixed relative of it after the same paper:
1 + attn_scale log(floor(n / floor_scale) + 1), one for every head, equal to 1 within floor_scale
tokens, where SSMax is s_h log n from the first token. Both scale q.k / sqrt(d) and not an encoding's
additive bias (ALiBi's keeps its slope), and a score cap acts after the scale.

Statistic: the learned ``s`` per query head and layer and ``factor``, s log n at the windows' last query.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_bool


class ScalableSoftmax(Mechanism):
    fields = ("ssmax",)
    attribute = "ssmax"
    given_positions_refusal = "counts each query's keys by its default position, 0..T-1"

    def __init__(self, cfg, layer: int) -> None:
        super().__init__(cfg, layer)
        self.window = cfg.layer_window[layer]
        self.s = nn.Parameter(torch.full((cfg.n_head,), 1 / math.log(max(cfg.max_seq_len, 2))))

    @classmethod
    def check_config(cls, cfg) -> None:
        check_bool("model", "ssmax", cfg.ssmax)

    def keys_seen(self, positions: torch.Tensor) -> torch.Tensor:
        """n for queries at positions [T]: position + 1, at most the window."""
        n = positions + 1
        return n if self.window is None else n.clamp(max=self.window)

    def queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries q [B, n_head, T, D] at positions [T] -> q * s_h log n, the factor in float32."""
        factor = self.s[:, None] * torch.log(self.keys_seen(positions).float())  # [n_head, T]
        return q * factor.to(q.dtype)[:, :, None]

    @classmethod
    def statistic(cls, layers: list[ScalableSoftmax], seq_len: int) -> dict[str, Any]:
        last = torch.tensor([seq_len - 1], device=layers[0].s.device)
        return {"s": [layer.s.tolist() for layer in layers],
                "factor": [(layer.s * layer.keys_seen(last).float().log()).tolist() for layer in layers]}

    @classmethod
    def headline(cls, statistic: dict[str, Any]) -> tuple[str, float]:
        return "s log n", float(torch.tensor(statistic["factor"]).mean())
