"""ALiBi (Press et al. 2022, "Train Short, Test Long", arXiv:2108.12409).

No position enters the embeddings; each head adds -slope * (query_pos - key_pos) to its
attention logits (not divided by sqrt(head_dim)). Slopes are the geometric sequence
2^(-8/n), 2^(-16/n), ... for n heads when n is a power of two; otherwise the slopes of the
nearest lower power of two followed by every other slope of the doubled count.
"""

from __future__ import annotations

import math

import torch

from nanoattn.positional.base import PositionalEncoding


def alibi_slopes(n_head: int) -> list[float]:
    def power_of_two_slopes(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    if n_head & (n_head - 1) == 0:
        return power_of_two_slopes(n_head)
    lower = 2 ** math.floor(math.log2(n_head))
    extra = power_of_two_slopes(2 * lower)[0::2][: n_head - lower]
    return power_of_two_slopes(lower) + extra


class ALiBiPositionalEncoding(PositionalEncoding):
    adds_bias = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(cfg.n_head)), persistent=False)

    def bias(self, q, k, q_positions: torch.Tensor, k_positions: torch.Tensor, layer: int) -> torch.Tensor:
        distance = (q_positions[..., :, None] - k_positions[..., None, :]).float()  # [(B,) Tq, Tk]
        return -self.slopes.float()[:, None, None] * distance.unsqueeze(-3)  # [(B,) n_head, Tq, Tk]
