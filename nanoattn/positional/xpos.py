"""xPos (Sun et al. 2022, arXiv:2212.10554, "A Length-Extrapolatable Transformer"): RoPE plus a decay.

The rotation is RoPE's (``RotaryPositionalEncoding``: half-split layout, ``rope_theta``, any
``rope_scaling``, ``rope_fraction``, ``rope_p``). On top of it, pair i (dims i and i + d/2) of a
query at position n is multiplied by zeta_i^(n / gamma) and of a key at position m by
zeta_i^(-m / gamma), so every score is the RoPE score with each pair decayed by the distance:

    q_n . k_m = sum_i zeta_i^((n - m) / gamma) * (RoPE score of pair i),   n - m >= 0,

    zeta_i = (2i / d + 0.4) / (1 + 0.4),  i < d / 2,   gamma = model.xpos_scale_base (512).

zeta_i rises from 2/7 at i = 0 (the highest frequency decays fastest) to nearly 1. These are the
numbers of torchscale's ``XPOS`` (microsoft/torchscale, torchscale/component/xpos_relative_position.py:
``scale = (arange(0, d, 2) + 0.4 d) / (1.4 d)``, ``scale_base = 512``, queries times
``scale ** (pos / scale_base)``, keys times its inverse via ``downscale=True``), whose rotation is
RoPE's theta^(-2i/d) in the interleaved layout (the same map under a fixed permutation of dims).
d is the rotary dim; the dims that do not rotate (past ``rope_fraction``, or the frequencies
``rope_p`` drops) do not decay either (factor 1): they are NoPE dims.

Numerical safety. One factor shrinks and the other grows exponentially with the position, so:
- the factors are exp(+-(n - c) * ln(zeta_i) / gamma), where ln(zeta_i) / gamma is computed once
  in float64 and rounded to float32, n - c is an exact int64 difference (exact in float32 below
  2^24), and the product and exp are float32 (elementwise, unaffected by autocast); only the
  finished factor is cast to the activations' dtype;
- positions are offset by a constant c = max_seq_len // 2, the same in every call: a key is scaled
  at its own position before it is cached, exactly as a recomputation would scale it, so cached
  decoding equals recomputation. The offset cancels in every score
  (zeta^((n - c)/gamma) zeta^(-(m - c)/gamma) = zeta^((n - m)/gamma)); it only centres the range,
  as torchscale centres positions on the current length (it can move its centre because it
  re-scales every cached key at each step; we cannot, and need not).
- ``check_length`` refuses lengths where a factor would pass 2^+-100 (|n - c| > 100 ln 2 gamma /
  ln 3.5: 28,328 positions for gamma = 512), leaving float32's and bfloat16's range (2^+-126) room
  for the values scaled; ``check_config`` refuses a gamma too small for max_seq_len itself. Under
  float16 (range 2^-14 to 2^16) ``scale_keys`` refuses positions where a factor passes 2^+-8
  (|n - c| > 2,266 for gamma = 512) rather than overflow to inf; that check reads the positions
  back from the device, so it runs only for float16 inputs.
"""

from __future__ import annotations

import math

import torch

from nanoattn.positional.rope import RotaryPositionalEncoding
from nanoattn.validation import as_float, fail

LOG2_LIMIT = 100.0  # float32 / bfloat16: every factor within 2^-100 .. 2^100
FLOAT16_LOG2_LIMIT = 8.0  # float16: within 2^-8 .. 2^8


def xpos_zeta(dim: int) -> torch.Tensor:
    """zeta_i = (2i / dim + 0.4) / 1.4 for i < dim // 2: float64 [dim // 2], torchscale's expression."""
    return (torch.arange(0, dim, 2, dtype=torch.float64) + 0.4 * dim) / (1.4 * dim)


def xpos_max_distance(scale_base: float, log2_limit: float = LOG2_LIMIT) -> int:
    """Largest |position - offset| at which every factor zeta_i^(+-|n - c| / gamma) is within 2^+-limit."""
    return int(log2_limit * math.log(2.0) * scale_base / math.log(3.5))  # -ln(zeta_0) = ln(7/2)


class XPosPositionalEncoding(RotaryPositionalEncoding):
    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.scale_base = float(cfg.xpos_scale_base)
        self.offset = cfg.max_seq_len // 2  # c: constant, so cached keys equal recomputed ones
        self.max_distance = xpos_max_distance(self.scale_base)
        half = self.rotary_dim // 2
        pair_rate = torch.log(xpos_zeta(self.rotary_dim)[:self.kept]) / self.scale_base  # [kept] float64
        rate = torch.zeros(self.head_dim, dtype=torch.float64)  # ln(zeta) / gamma per dim, 0: no decay
        rate[:self.kept] = pair_rate
        rate[half:half + self.kept] = pair_rate
        self._rate = rate.to(torch.float32)
        # device -> (rate, -rate), each float32 [head_dim]
        self._rates: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def check_config(cls, cfg) -> None:
        super().check_config(cfg)
        gamma = as_float(cfg.xpos_scale_base)
        if not (math.isfinite(gamma) and gamma > 0):
            fail("model", "xpos_scale_base", cfg.xpos_scale_base,
                 "must be a positive number (512 in the paper)")
        offset = cfg.max_seq_len // 2
        distance = max(offset, cfg.max_seq_len - 1 - offset)
        if distance > xpos_max_distance(gamma):
            needed = math.ceil(distance * math.log(3.5) / (LOG2_LIMIT * math.log(2.0)) * 1000) / 1000
            fail("model", "xpos_scale_base", cfg.xpos_scale_base,
                 f"must be >= {needed:g} for max_seq_len={cfg.max_seq_len}: the decay factors "
                 f"zeta^(+-{distance}/gamma) would pass 2^+-{LOG2_LIMIT:g}")

    def check_length(self, seq_len: int) -> None:
        super().check_length(seq_len)
        if max(self.offset, seq_len - 1 - self.offset) > self.max_distance:
            raise ValueError(
                f"length {seq_len} is past xPos's float range: positions past "
                f"{self.offset + self.max_distance} (offset {self.offset} + {self.max_distance}) take decay "
                f"factors zeta^(+-(n - {self.offset})/{self.scale_base:g}) beyond 2^+-{LOG2_LIMIT:g}; "
                f"a larger model.xpos_scale_base (now {self.scale_base:g}) reaches further")

    def _factors(self, positions: torch.Tensor, sign: int) -> torch.Tensor:
        """float32 [(B,) 1, T, head_dim]: zeta^(sign * (n - c) / gamma) at each of positions [(B,) T]."""
        # Compiled code makes them in its graph: one that read the kept ones would compile again.
        compiling = torch.compiler.is_compiling()
        rates = None if compiling else self._rates.get(positions.device)
        if rates is None:
            rate = self._rate.to(positions.device)
            rates = (rate, -rate)
            if not compiling:
                self._rates[positions.device] = rates
        shift = (positions - self.offset).to(torch.float32)  # [(B,) T], exact
        return torch.exp(shift[..., None] * rates[0 if sign > 0 else 1]).unsqueeze(-3)

    def _check_float16(self, positions: torch.Tensor) -> None:
        low, high = torch.stack(torch.aminmax(positions)).tolist()
        distance = max(self.offset - low, high - self.offset)
        limit = xpos_max_distance(self.scale_base, FLOAT16_LOG2_LIMIT)
        if distance > limit:
            raise ValueError(
                f"xPos under float16: position {high if high - self.offset >= self.offset - low else low} "
                f"is {distance} from the offset {self.offset}, past {limit}, where a decay factor passes "
                f"2^+-{FLOAT16_LOG2_LIMIT:g} and keys would overflow; use bfloat16 or float32, or a larger "
                f"model.xpos_scale_base (now {self.scale_base:g})")

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return q * self._factors(positions, 1).to(q.dtype)  # [B, H, T, D] * [(B,) 1, T, D]

    def scale_keys(self, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if k.dtype == torch.float16:  # queries share the keys' positions in every call: checked once
            self._check_float16(positions)
        return k * self._factors(positions, -1).to(k.dtype)
