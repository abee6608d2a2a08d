"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers", arXiv:2310.04418).

No position enters the embeddings; each head adds a learned function of the progressively
interpolated distance to its attention logits. For query position i and key position j <= i:

    bias_ij = f( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

with f an MLP 1 -> fire_mlp_width -> n_head (ReLU), c > 0 a learned log-transform scale and L a
learned threshold. The input lies in [0, 1] at any length (the interpolation), psi spends its
resolution on short distances, and L keeps short contexts from being stretched to [0, 1]:
below it the normaliser is constant and the bias depends on i - j only.

Choices, following the reference PyTorch module that circulates with the paper (public copies
are marked "From the FIRE paper", e.g. mcleish7/arithmetic, cramming/architectures/embeddings.py):
- i and j are absolute 0-based positions (the token indices the model hands every encoding), i
  the query's; at i = 0 the normaliser is psi(L) > 0, so nothing divides by zero, and eps = 1e-6
  is added to the normaliser as in the reference.
- Positivity by absolute value, as in the reference: c is used as |c|, L as |s| * L0 with a
  learned multiplier s (init 1), so that L moves by a relative step under Adam, not by lr tokens.
- Init: c = 0.1 (reference); L0 = max_seq_len / 4, i.e. the reference's init_L = 512 at the
  2048-token training length its copies describe; the MLP as torch's nn.Linear default
  (kaiming-uniform weights and uniform biases, bound 1 / sqrt(fan_in)), as the reference builds
  it from nn.Linear. The parameters are plain tensors, not nn.Linear, because the model
  re-initialises every nn.Linear at N(0, init_std): both MLP layers near zero would start FIRE
  as NoPE with vanishing gradients (each layer's gradient is scaled by the other's weights).
- Per layer: each layer using FIRE has its own c, L and MLP (``layer_slot``). The MLP's weight
  matrices are decayed like every matmul weight; its biases, c and s are not (ndim < 2).
- Cost: only the chunk's [Tq, Tk] grid is evaluated (the input depends on both i - j and i, so
  there is no smaller table in general), and not through a [width, Tq, Tk] hidden layer: with
  a scalar input, f is piecewise linear, unit k switching at x = -b1_k / w1_k. Between the sorted
  switch points each head's f is slope * x + intercept, both sums of w2 * w1 and w2 * b1 over the
  units active there ([n_head, width + 1] tables, differentiable in the weights). A bias entry is
  then one binary search over the switch points and two table reads: the same values (to float
  rounding) and gradients as the MLP written out (``mlp``, the tested reference), about 4x
  cheaper forward and backward on a CPU at width 32. The one difference is the ReLU's
  subgradient exactly at the switch point of a unit with w1 > 0 (1 here, 0 in torch's relu),
  where the value itself is the same.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding
from nanoattn.validation import check_positive_int

INIT_C = 0.1
L_FRACTION = 0.25  # L0 / max_seq_len: the reference's 512 at its training length 2048
EPS = 1e-6


class FIRELayer(nn.Module):
    """One layer's FIRE parameters: c, the multiplier s of L, and the MLP 1 -> width -> n_head."""

    def __init__(self, n_head: int, width: int, init_L: float) -> None:
        super().__init__()
        self.c = nn.Parameter(torch.tensor(INIT_C))
        self.L_scale = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_L", torch.tensor(float(init_L)), persistent=False)
        self.w1 = nn.Parameter(torch.empty(width, 1))  # [width, 1], as nn.Linear(1, width).weight
        self.b1 = nn.Parameter(torch.empty(width))
        self.w2 = nn.Parameter(torch.empty(n_head, width))  # as nn.Linear(width, n_head).weight
        self.b2 = nn.Parameter(torch.empty(n_head))
        for weight, bias_, fan_in in ((self.w1, self.b1, 1), (self.w2, self.b2, width)):
            bound = 1.0 / math.sqrt(fan_in)  # nn.Linear's default init (kaiming_uniform, a = sqrt(5))
            nn.init.uniform_(weight, -bound, bound)
            nn.init.uniform_(bias_, -bound, bound)

    @property
    def threshold(self) -> torch.Tensor:
        return (self.L_scale.float() * self.init_L).abs()

    def normalized_distance(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        """psi(i - j) / psi(max(L, i)) [(B,) Tq, Tk], float32 (keys after their query count as j = i), at
        positions [Tq], [Tk] or per-token ones [B, Tq], [B, Tk]."""
        c = self.c.float().abs()
        distance = (q_positions[..., :, None] - k_positions[..., None, :]).clamp(min=0)  # [(B,) Tq, Tk]
        distance = distance.float()
        normalizer = torch.maximum(q_positions.float(), self.threshold)  # [(B,) Tq]: max(L, i)
        return torch.log1p(c * distance) / (torch.log1p(c * normalizer)[..., None] + EPS)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) for inputs x [(B,) Tq, Tk] -> [(B,) n_head, Tq, Tk], evaluated as written (the reference)."""
        hidden = torch.relu(self.w1.float() * x.reshape(1, -1) + self.b1.float()[:, None])  # [width, x.numel]
        out = torch.addmm(self.b2.float()[:, None], self.w2.float(), hidden)  # [n_head, x.numel()]
        return out.view(-1, *x.shape).movedim(0, -3)

    def pieces(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """f as a piecewise linear function: (switch points [width] ascending, slopes and
        intercepts [n_head, width + 1]), f(x) = slope[:, s] * x + intercept[:, s] on interval s,
        where s = #(switch points <= x). Slopes and intercepts are differentiable in the weights."""
        w1, b1 = self.w1.float()[:, 0], self.b1.float()  # [width]
        with torch.no_grad():  # which units are active on which interval: piecewise constant
            moving = w1 != 0
            switch = torch.where(moving, -b1 / torch.where(moving, w1, 1.0), 0.0)  # unit k is 0 at x = -b1/w1
            points, order = torch.sort(switch)
            rank = torch.empty_like(order).scatter_(0, order, torch.arange(len(order), device=order.device))
            interval = torch.arange(len(order) + 1, device=order.device)[:, None]  # [width + 1, 1]
            # On interval s (points[s-1] <= x < points[s]) unit k is active when x > its switch point
            # (w1 > 0: s > rank), when x < it (w1 < 0: s <= rank), or everywhere if b1 > 0 (w1 = 0).
            active = torch.where(w1 > 0, interval > rank, torch.where(w1 < 0, interval <= rank, b1 > 0))
            active = active.float()  # [width + 1, width]
        w2 = self.w2.float()  # [n_head, width]
        slopes = (w2 * w1) @ active.T  # [n_head, width + 1]
        intercepts = (w2 * b1) @ active.T + self.b2.float()[:, None]
        return points, slopes, intercepts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """f(x) for inputs x [(B,) Tq, Tk] -> [(B,) n_head, Tq, Tk]: ``mlp`` evaluated piece by piece."""
        points, slopes, intercepts = self.pieces()
        interval = torch.searchsorted(points, x.detach().reshape(-1), right=True)  # [x.numel()]
        slope = slopes.index_select(1, interval).view(-1, *x.shape)  # [n_head, (B,) Tq, Tk]
        bias = torch.addcmul(intercepts.index_select(1, interval).view(-1, *x.shape), slope, x)
        return bias.movedim(0, -3)


class FIREPositionalEncoding(PositionalEncoding):
    adds_bias = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        init_L = L_FRACTION * cfg.max_seq_len
        self.per_layer = nn.ModuleList(FIRELayer(cfg.n_head, cfg.fire_mlp_width, init_L) for _ in self.layers)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_positive_int("model", "fire_mlp_width", cfg.fire_mlp_width)

    def bias(self, q, k, q_positions: torch.Tensor, k_positions: torch.Tensor, layer: int) -> torch.Tensor:
        fire = self.per_layer[self.layer_slot(layer)]
        return fire(fire.normalized_distance(q_positions, k_positions))  # [(B,) n_head, Tq, Tk]
