"""Fixed sinusoidal positions (Vaswani et al. 2017, arXiv:1706.03762), added to embeddings.

PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), defined at any
position. GPT-style embeddings start with std 0.02, so a unit-amplitude signal would drown
them. The original Transformer multiplies the embeddings by sqrt(d_model); here the table gets a
learned per-dimension amplitude instead (x-transformers learns one scalar, initialised to
d_model ** -0.5), started at the embeddings' scale. Measured in the extrapolation lab's recipe at
200 steps (docs/fair_baselines.md, val loss against RoPE's 4.810): sqrt(d_model)-scaled
embeddings 5.282 (perplexity 1.60x RoPE's), one learned scalar 5.364, the per-dimension
amplitude 4.946 (1.15x); at 1,000 steps the amplitude gives 4.218 against RoPE's 3.978 (1.27x).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding


def sinusoidal_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The seed formula at integer positions [T] -> [T, d_model] float32 (d_model may be odd).

    The angle is computed in float64 (MPS has none: float32 there): at position 10^4 a float32
    angle is off by ~1e-3 rad, a visible error in the table's fast dimensions.
    """
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    two_i = torch.arange(0, d_model, 2, dtype=torch.int64, device=positions.device).to(wide)  # [ceil(d/2)]
    angle = positions.to(wide)[:, None] / torch.pow(10000.0, two_i / d_model)[None, :]  # [T, ceil(d/2)]
    table = torch.empty(positions.numel(), d_model, device=positions.device, dtype=wide)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return table.float()


class SinusoidalPositionalEncoding(PositionalEncoding):
    acts_on_embeddings = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.d_model = cfg.d_model
        # A learned per-dimension amplitude of the fixed table, started where the sinusoid's rms
        # (1/sqrt(2) per dimension) matches the token embeddings' std (init_std).
        self.scale = nn.Parameter(torch.full((cfg.d_model,), math.sqrt(2) * cfg.init_std))

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pe = sinusoidal_table(positions, self.d_model).to(x.dtype)  # [T, d_model]
        return x + self.scale.to(x.dtype) * pe  # [B, T, d] + [d] * [T, d]
