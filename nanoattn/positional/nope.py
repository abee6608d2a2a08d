"""NoPE: no positional information at all (Kazemnejad et al. 2023, arXiv:2305.19466).

A causal decoder can still infer positions from the mask (a token sees how many tokens
precede it through the softmax normalisation), which is why NoPE language models train.

Optional query temperature (``ModelConfig.temperature_floor_scale``), as Llama 4 applies on its
NoPE layers after Nakanishi 2025 (arXiv:2501.19399, "Scalable-Softmax"): the query at position
p is multiplied by ``log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1``, which keeps
attention from flattening as the number of keys grows. It is 1 below ``floor_scale - 1``, so
a model trained shorter than ``floor_scale`` sees it only past its training length.
"""

from __future__ import annotations

import torch

from nanoattn.positional.base import PositionalEncoding


def query_temperature(positions: torch.Tensor, floor_scale: int, attn_scale: float) -> torch.Tensor:
    """Llama 4's multiplier of the query at each of positions [T] -> float32 [T]."""
    steps = torch.floor((positions.float() + 1.0) / floor_scale)
    return torch.log1p(steps) * attn_scale + 1.0


class NoPositionalEncoding(PositionalEncoding):
    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.floor_scale = cfg.temperature_floor_scale
        self.attn_scale = float(cfg.temperature_attn_scale)

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.floor_scale is None:
            return q
        scale = query_temperature(positions, self.floor_scale, self.attn_scale)  # [T]
        return q * scale.to(q.dtype)[:, None]  # [B, H, T, D] * [T, 1]
