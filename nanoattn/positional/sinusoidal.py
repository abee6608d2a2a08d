"""Fixed sinusoidal positions (Vaswani et al. 2017, arXiv:1706.03762), added to embeddings.

PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), defined at any
position. The table is added to the token embeddings times one learned amplitude ``scale``
(as x-transformers' ScaledSinusoidalEmbedding), started at AMPLITUDE_INIT = 0: the model starts
as NoPE and raises the amplitude as far as training finds the sinusoid useful. The embeddings are
not multiplied by sqrt(d_model) (the original Transformer's rule).

Why (docs/fair_baselines.md: the extrapolation lab's model, one run per variant, perplexity at
128 tokens as a multiple of RoPE's in the same recipe). Embeddings start at std 0.02, so
sqrt(d_model)-scaled embeddings plus the unit table start with the position signal at 3x the
tokens' rms: 2.05x RoPE in the lab's recipe (250 steps, warmup 25), 1.60x at 200 steps (warmup
50). A learned amplitude helps only when it starts small: one amplitude started at
d_model ** -0.5 (x-transformers' value) 1.74x, at 0.028 1.32x, at 0 1.15x (200 steps). A
per-dimension amplitude started at 0.028 matched it at 200 steps (1.14x) but not under the lab's
shorter warmup (1.70x: a few high-frequency amplitudes grew early and the run never recovered);
in the lab's recipe, per dimension from 0 gave 1.17x and one amplitude from 0 1.14x (NoPE 1.18x).
Caveat: after those 250 steps the amplitude is 0.0009 (the position signal ~1% of the tokens'
rms), and the model extrapolates like NoPE.
"""

from __future__ import annotations

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding

# The amplitude's start (measured against 0.028 and d_model ** -0.5 above); a ModelConfig field to be.
AMPLITUDE_INIT = 0.0


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
        self.scale = nn.Parameter(torch.full((1,), AMPLITUDE_INIT))  # the table's learned amplitude
        # (shape [1], as x-transformers', so checkpoints and optimizer groups see an ordinary 1-D gain)

    def reset_parameters(self) -> None:
        nn.init.constant_(self.scale, AMPLITUDE_INIT)

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        pe = sinusoidal_table(positions, self.d_model).to(x.dtype)  # [T, d_model]
        return x + self.scale.to(x.dtype) * pe  # [B, T, d] + [1] * [T, d]
