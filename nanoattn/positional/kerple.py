"""KERPLE (Chi et al. 2022, "KERPLE: Kernelized Relative Positional Embedding for Length
Extrapolation", arXiv:2205.09921).

No position enters the embeddings; each head adds a conditionally positive definite kernel of
the distance d = |m - n| (query m, key n; causal, so d = m - n >= 0) to its attention logits,
with learned positive parameters r1, r2 per head:

- ``kerple_log``:   -r1 * log(1 + r2 * d)      (r1, r2 > 0), the variant the paper's abstract
  singles out for extrapolation;
- ``kerple_power``: -r1 * d ** r2              (r1 > 0, 0 < r2 <= 2); r2 = 1 is ALiBi with a
  learned slope.

Choices, following the authors' released code (chijames/KERPLE, a GPT-NeoX fork,
``ParallelKerpleLog`` / ``ParallelKerplePower``):
- One r1, r2 [n_head] per model, shared by every layer that uses the encoding, whatever the
  depth: the authors' model builds one kernel module and hands that same module to each of its
  attention layers. They are 1-D, so the optimizer does not decay them, like norm gains and
  biases.
- Initialisation as the authors': the parameter in front of the kernel uniform in (0, 1) for the
  power kernel's r1 and (0, 2) for the log kernel's r1; the one inside it uniform in (0, 1) for
  the log kernel's r2 and (0, 2) for the power exponent r2 (torch.rand * scale).
- Positivity as the authors': no softplus; every parameter is kept >= eps = 1e-2, and the power
  exponent <= 2, by projecting the stored parameters into that range in place after every
  optimizer update (``project_parameters``, called by the trainer), i.e. projected gradient
  descent. The authors clamp ``.data`` at the start of each forward, which is the same
  projection at the next use; doing it after the update keeps the forward free of in-place
  edits (it runs once per query chunk, under autograd and torch.compile). The forward uses the
  stored values as they are, so a parameter pushed past a bound sits on it rather than drifting,
  and its gradient there is the kernel's own. The initial draw is projected too (a draw below
  eps has probability 1/100 or 1/200 per head), as the authors' first forward does.
- float32 from integer distances, on the chunk's [n_head, Tq, Tk] grid: log1p and two products
  for the log kernel; the power kernel as exp(r2 * log d) with log d computed once for all heads
  (cheaper than a tensor-exponent pow, forward and backward).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding

EPS = 1e-2  # the authors' lower bound on every kernel parameter
MAX_POWER = 2.0  # the power kernel is conditionally positive definite for 0 < r2 <= 2


class KERPLEPositionalEncoding(PositionalEncoding):
    """The shared part: one r1, r2 [n_head] for every layer, their range, and the distance grid."""

    adds_bias = True
    takes_positions = True
    # (scale of r1's uniform init, scale of r2's), upper bound of r2 (None: unbounded)
    r1_scale: float
    r2_scale: float
    r2_max: float | None = None
    # The subclass's kernel: (distance [(B,) 1, Tq, Tk], r1, r2 [n_head, 1, 1]) -> bias [(B,) n_head, Tq, Tk].
    kernel: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.r1 = nn.Parameter(torch.rand(cfg.n_head) * self.r1_scale)  # [n_head]
        self.r2 = nn.Parameter(torch.rand(cfg.n_head) * self.r2_scale)  # [n_head]
        self.project_parameters()

    @torch.no_grad()
    def project_parameters(self) -> None:
        self.r1.clamp_(min=EPS)
        self.r2.clamp_(min=EPS, max=self.r2_max)

    def bias(self, q, k, q_positions: torch.Tensor, k_positions: torch.Tensor, layer: int) -> torch.Tensor:
        # Keys after their query are masked by the caller; clamping their distance to 0 keeps the
        # kernel (and its gradient) finite there.
        distance = (q_positions[..., :, None] - k_positions[..., None, :]).clamp(min=0)  # [(B,) Tq, Tk]
        distance = distance.float()
        r1, r2 = self.r1.float()[:, None, None], self.r2.float()[:, None, None]  # [n_head, 1, 1]
        return self.kernel(distance.unsqueeze(-3), r1, r2)  # [(B,) n_head, Tq, Tk]


class KERPLELogPositionalEncoding(KERPLEPositionalEncoding):
    r1_scale, r2_scale = 2.0, 1.0

    @staticmethod
    def kernel(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        return -r1 * torch.log1p(r2 * distance)  # [n_head, Tq, Tk]


class KERPLEPowerPositionalEncoding(KERPLEPositionalEncoding):
    r1_scale, r2_scale, r2_max = 1.0, 2.0, MAX_POWER

    @staticmethod
    def kernel(distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        # d ** r2 as exp(r2 log d) with log d computed once for all heads, cheaper than
        # distance.pow(r2) forward and backward. d = 0 (log d = -inf) would give a nan gradient in
        # r2 (0 * -inf), so log d is taken at max(d, 1) and d = 0 gets its value 0 by the where.
        log_distance = torch.log(distance.clamp(min=1.0))  # [Tq, Tk]
        power = torch.exp(r2 * log_distance)  # [n_head, Tq, Tk]
        return torch.where(distance > 0, -r1 * power, 0.0)  # [n_head, Tq, Tk]
