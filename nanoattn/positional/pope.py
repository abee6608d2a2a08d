"""PoPE (Gopalakrishnan et al. 2025, arXiv:2509.10534, "Decoupling the 'What' and 'Where' With Polar
Coordinate Positional Embeddings").

Each of a head's d channels becomes a complex number whose magnitude comes from the content and
whose phase comes from the position only:

    q~_tc = softplus(q_tc) e^{i t theta_c},    k~_sc = softplus(k_sc) e^{i (s theta_c + delta_c)},

    score_ts = Re[q~_t^H k~_s] / sqrt(d)
             = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c) / sqrt(d)

with theta_c = rope_theta^(-c / d) for c = 0 .. d - 1: d frequencies where RoPE has d / 2, the
frequencies of a RoPE head of width 2d. In RoPE a query pair's own angle adds to the position's,
so content and position share one angle (the paper's "what-where" entanglement); here no
content reaches the phase. delta is the optional learned phase bias (``model.pope_phase_bias``).

Choices, each compared with x-transformers' ``PolarEmbedding`` / ``apply_polar_pos_emb`` in the tests:
- Real form: a complex channel is stored as the pair (mu cos, mu sin), a head as [mu cos | mu sin],
  2d reals, as x-transformers stores it; then q.k of the real forms is Re[q~^H k~]. Attention
  divides by the square root of that width, 2d, so ``scale_queries`` multiplies by sqrt(2): the
  logits keep the 1/sqrt(d) of a d-channel head (x-transformers passes scale = dim_head^-0.5).
  The KV cache stores keys in this form (``key_width``: 2d numbers a key head, against d).
- delta: x-transformers adds it to the keys' phase, one per head and frequency. Here the queries
  turn by -delta, which gives the same score cos((s - t) theta + delta): with MHA the same
  function, with GQA one delta per query head (a key-side one would be shared by the query heads
  of its group). Each layer has its own deltas (x-transformers shares one set across the layers);
  they start at 0 (PoPE without the bias) and stay in x-transformers' range [-2 pi, 0], put back
  in it after each update (``project_parameters``) where x-transformers clamps the value used: the
  same forward for every delta in range.
- Rotary: the phases are RoPE's angles at width 2d, so every RoPE scaling applies to them
  (``rope_frequencies(2 head_dim, ...)``) and its attention factor multiplies both magnitudes (the
  logits by its square, as RoPE's). The paper's claim is that PoPE extrapolates without one; the
  extrapolation lab measures that, and a scaling stays a choice. Partial RoPE and p-RoPE, which
  leave some of RoPE's pairs unrotated, have no PoPE counterpart in the paper and are refused, as
  is QK-norm after the map (it would normalise the real form's 2d numbers with d gains).
- Precision: phases as RoPE's (int64 positions, float32 tables outside autocast); softplus and
  the products in float32, cast to the activations' dtype at the end, as x-transformers does.

A key is mapped at its own position before it is cached and its phase never depends on the
length (unless a length-dependent scaling, as for RoPE), so cached decoding equals recomputation
at any length.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.positional.base import PositionalEncoding
from nanoattn.positional.rope import RotaryPositionalEncoding
from nanoattn.positional.rope_scaling import rope_depends_on_length
from nanoattn.validation import as_float, fail

# The learned phase bias's range (x-transformers' clamp): a full turn, ending at no bias.
PHASE_BIAS_RANGE = (-2 * math.pi, 0.0)


class PolarLayer(RotaryPositionalEncoding):
    """PoPE in one layer: RoPE's phase tables at width 2d and this layer's phase bias, one per head and
    frequency, stored flat [n_head * d] as a bias is: weight decay, which the optimizer gives only
    to matrices, would pull the angles toward 0."""

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers, head_dim=2 * cfg.head_dim)  # tables [L, head_dim]: d frequencies
        self.n_head = cfg.n_head
        flat = torch.zeros(cfg.n_head * cfg.head_dim)
        self.phase_bias = nn.Parameter(flat) if cfg.pope_phase_bias else None

    def reset_parameters(self) -> None:
        if self.phase_bias is not None:
            nn.init.zeros_(self.phase_bias)

    def project_parameters(self) -> None:
        if self.phase_bias is not None:
            with torch.no_grad():
                self.phase_bias.clamp_(*PHASE_BIAS_RANGE)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        """x [B, heads, T, d] -> the real form [B, heads, T, 2d]: [softplus(x) cos | softplus(x) sin]."""
        cos, sin = self.phases(positions, seq_len)  # float32 [(B,) T, d], the attention factor included
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)  # shared by the heads
        magnitude = F.softplus(x.float())  # [B, heads, T, d]
        return torch.cat((magnitude * cos, magnitude * sin), dim=-1).to(x.dtype)

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries [B, n_head, T, 2d] turned by -delta and times sqrt(2) (the module docstring)."""
        if self.phase_bias is None:
            return q * math.sqrt(2.0)
        # (a + ib) e^{-i delta} = (a cos + b sin) + i (b cos - a sin), per head and frequency
        delta = self.phase_bias.view(self.n_head, 1, -1)  # [n_head, 1, d]
        cos = (torch.cos(delta) * math.sqrt(2.0)).to(q.dtype)
        sin = (torch.sin(delta) * math.sqrt(2.0)).to(q.dtype)
        a, b = q.chunk(2, dim=-1)  # [B, n_head, T, d] each
        return torch.cat((a * cos + b * sin, b * cos - a * sin), dim=-1)


class PolarPositionalEncoding(PositionalEncoding):
    """The registry's ``pope``: one ``PolarLayer`` per layer using it, each handed out by ``for_layer``."""

    rotary = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.by_layer = nn.ModuleList(PolarLayer(cfg, [layer]) for layer in self.layers)
        self.length_dependent_rotation = rope_depends_on_length(cfg.rope_scaling)

    @classmethod
    def check_config(cls, cfg) -> None:
        for name in ("rope_fraction", "rope_p"):
            if as_float(getattr(cfg, name)) != 1:
                fail("model", name, getattr(cfg, name), "must be 1 with pos='pope': every channel of a head "
                     "takes a phase (partial RoPE and p-RoPE have no PoPE form)")

    @classmethod
    def key_width(cls, head_dim: int) -> int:
        return 2 * head_dim

    def reset_parameters(self) -> None:
        for layer in self.by_layer:
            layer.reset_parameters()

    def for_layer(self, layer: int) -> PositionalEncoding:
        return self.by_layer[self.layer_slot(layer)]

    def rotation_changes(self, old_len: int, new_len: int) -> bool:
        return self.by_layer[0].rotation_changes(old_len, new_len)
