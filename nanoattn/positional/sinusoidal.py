"""Sinusoidal positions added to the token embeddings (Vaswani et al. 2017, arXiv:1706.03762).

PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), defined at any
position.

- ``sinusoidal`` is the paper's encoding: fixed, no trainable parameter, the token embeddings
  multiplied by sqrt(d_model) (section 3.4) and the table added. The scale matters here: GPT's
  embeddings start at std init_std, which a unit-amplitude table would swamp.
- ``sinusoidal_scaled`` is a tuned variant under its own name, so a row called "sinusoidal" means
  the paper's: the table times one learned amplitude ``scale`` (x-transformers'
  ScaledSinusoidalEmbedding), started at AMPLITUDE_INIT = 0 so the model starts as NoPE and raises
  the amplitude as far as training finds the sinusoid useful; the embeddings are not scaled.
  docs/fair_baselines.md has the runs behind the choice of start.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding

# ``sinusoidal_scaled``'s amplitude at the start (docs/fair_baselines.md); a ModelConfig field to be.
AMPLITUDE_INIT = 0.0


def sinusoidal_table(positions: torch.Tensor, d_model: int) -> torch.Tensor:
    """The seed formula at integer positions [...] -> [..., d_model] float32 (d_model may be odd).

    The angle is computed in float64 (MPS has none: float32 there): at position 10^4 a float32
    angle is off by ~1e-3 rad, a visible error in the table's fast dimensions.
    """
    wide = torch.float32 if positions.device.type == "mps" else torch.float64
    two_i = torch.arange(0, d_model, 2, dtype=torch.int64, device=positions.device).to(wide)  # [ceil(d/2)]
    angle = positions.to(wide)[..., None] / torch.pow(10000.0, two_i / d_model)  # [..., ceil(d/2)]
    table = torch.empty(*positions.shape, d_model, device=positions.device, dtype=wide)
    table[..., 0::2] = torch.sin(angle)
    table[..., 1::2] = torch.cos(angle[..., : d_model // 2])
    return table.float()


class SinusoidalPositionalEncoding(PositionalEncoding):
    """Vaswani et al.'s: sqrt(d_model) * embeddings + the fixed table."""

    acts_on_embeddings = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.d_model = cfg.d_model

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pe = sinusoidal_table(positions, self.d_model).to(x.dtype)  # [(B,) T, d_model]
        return x * math.sqrt(self.d_model) + pe  # [B, T, d] + [(B,) T, d]


class ScaledSinusoidalPositionalEncoding(PositionalEncoding):
    """Embeddings + one learned amplitude times the table, the amplitude started at AMPLITUDE_INIT."""

    acts_on_embeddings = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.d_model = cfg.d_model
        self.scale = nn.Parameter(torch.full((1,), AMPLITUDE_INIT))  # the table's learned amplitude
        # (shape [1], as x-transformers', so checkpoints and optimizer groups see an ordinary 1-D gain)

    def reset_parameters(self) -> None:
        nn.init.constant_(self.scale, AMPLITUDE_INIT)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pe = sinusoidal_table(positions, self.d_model).to(x.dtype)  # [(B,) T, d_model]
        return x + self.scale.to(x.dtype) * pe  # [B, T, d] + [1] * [(B,) T, d]
