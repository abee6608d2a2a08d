"""RoPE scaling: a pure function from a scaling config to ``(inv_freq, attention_factor)``.

A scaling changes only two things: the inverse frequencies ``inv_freq`` [head_dim // 2] that
multiply positions, and an attention factor that multiplies cos and sin (so attention logits
scale by its square; the caller applies it). Each type is one small function in ``SCALINGS``;
the model never branches on the type. Types and the references whose numbers they match:

- ``linear``: position interpolation, Chen et al. 2023, https://arxiv.org/abs/2306.15595
  (kaiokendev's SuperHOT). Every frequency is divided by ``factor``.
- ``ntk``: static NTK-aware base change, bloc97 (r/LocalLLaMA, June 2023,
  https://www.reddit.com/r/LocalLLaMA/comments/14lz7j5/), written as
  ``b' = b * s ** (d / (d - 2))`` in the YaRN paper (section 3.1). transformers has no
  static counterpart; see the note on ``_ntk`` for how it relates to ``dynamic``.
- ``dynamic``: dynamic NTK, emozilla (r/LocalLLaMA, https://www.reddit.com/r/LocalLLaMA/comments/14mrgpr/),
  transformers' ``dynamic`` type: the base grows with the current length once it exceeds the
  original one. Length-dependent (``rope_depends_on_length``), like ``longrope``.
- ``yarn``: Peng et al. 2023, https://arxiv.org/abs/2309.00071. High-frequency pairs keep their
  frequency, low-frequency pairs are interpolated by ``factor``, a linear ramp in between whose
  ends come from ``beta_fast``/``beta_slow`` rotations over the *original* length; attention
  factor ``0.1 ln(factor) + 1`` (or DeepSeek's ``mscale``/``mscale_all_dim`` ratio).
- ``llama3``: Meta's Llama 3.1 ``apply_scaling`` (https://github.com/meta-llama/llama-models):
  by wavelength, long ones divided by ``factor``, short ones kept, smooth in between.
- ``longrope``: LongRoPE, Ding et al. 2024, https://arxiv.org/abs/2402.13753, as Phi-3 uses it
  (transformers' ``longrope``): pair i's frequency is divided by a searched per-pair factor,
  ``short_factor[i]`` while the length is at most the original one and ``long_factor[i]`` past
  it; attention factor ``sqrt(1 + ln(factor) / ln(original_max_seq_len))``. Length-dependent.

Numbers equal transformers' ``modeling_rope_utils`` (5.x) bit for bit: the same float32
operations in the same order, so tests can compare with ``atol=0``. Precision: inverse
frequencies always come from an int64 arange cast to float32 (never a bf16/fp16 arange), and
scalar parameters (bases, correction dims) stay Python floats (float64).

``normalize_rope_scaling`` (``rope_scaling_params.py``) validates a user mapping once (one-line
``ValueError`` naming the key) and fills every default, so the functions below read a complete,
plain dict; its types are ``SCALINGS``'s (tested).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from nanoattn.positional.rope_scaling_params import (
    WHERE,
    is_finite_number,
    normalize_rope_scaling,
    rope_depends_on_length,
    scaling_error,
)

# (rotary dim, theta, normalised params, current seq_len, device) -> (inv_freq [dim // 2], attention factor)
ScalingFn = Callable[[int, float, Mapping[str, Any], int | None, torch.device | None],
                     tuple[torch.Tensor, float]]


# ----------------------------------------------------------------------------- frequencies


def _unscaled(dim: int, theta: float, device: torch.device | None) -> torch.Tensor:
    """1 / theta ** (2i / dim) for i < dim / 2, float32 [dim // 2], from an int64 arange."""
    exponent = torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim
    return 1.0 / (theta ** exponent)


def ntk_base(theta: float, scale: float, dim: int) -> float:
    """The NTK-aware base theta * scale ** (d / (d - 2)) (YaRN paper, section 3.1), a Python float.

    The one formula static ``ntk`` and ``dynamic`` share, and that ``nanoattn.hf`` writes as a
    plain base: the same float64 expression gives bit-identical inverse frequencies.
    """
    if dim <= 2:
        raise ValueError(f"head_dim={dim} is invalid: NTK-aware scaling needs head_dim > 2")
    return theta * scale ** (dim / (dim - 2))


def _linear(dim: int, theta: float, p: Mapping[str, Any], seq_len: int | None,
            device: torch.device | None) -> tuple[torch.Tensor, float]:
    # Dividing the frequencies equals dividing the positions (phase = pos * inv_freq).
    return _unscaled(dim, theta, device) / p["factor"], 1.0


def _ntk(dim: int, theta: float, p: Mapping[str, Any], seq_len: int | None,
         device: torch.device | None) -> tuple[torch.Tensor, float]:
    # The lowest pair is interpolated by exactly factor, the highest is nearly untouched.
    # Relation to transformers' dynamic formula theta * (f * L / L0 - (f - 1)) ** (d / (d - 2)):
    # this equals dynamic(factor=1) at L = factor * L0, and dynamic(factor=f) at
    # L = L0 * (2f - 1) / f -- not dynamic(factor=f) at L = f * L0 (that base is f**2 - f + 1).
    return _unscaled(dim, ntk_base(theta, p["factor"], dim), device), 1.0


def _dynamic(dim: int, theta: float, p: Mapping[str, Any], seq_len: int | None,
             device: torch.device | None) -> tuple[torch.Tensor, float]:
    original = p["original_max_seq_len"]
    if seq_len is None or seq_len <= original:
        # Within the training context the model sees exactly its training frequencies.
        return _unscaled(dim, theta, device), 1.0
    factor = p["factor"]
    # Python floats (float64), as transformers with an int seq_len; see docs/rope_scaling.md.
    scale = factor * seq_len / original - (factor - 1)
    return _unscaled(dim, ntk_base(theta, scale, dim), device), 1.0


def yarn_correction_range(dim: int, theta: float, beta_fast: float, beta_slow: float,
                          original_max_seq_len: int, truncate: bool = True) -> tuple[float, float]:
    """Pair indices (low, high) where YaRN's ramp starts and ends.

    Pair i rotates L0 / (2 pi theta ** (2i / dim)) times over the original length L0; solving
    for beta rotations gives i = dim ln(L0 / (2 pi beta)) / (2 ln theta). Pairs below ``low``
    (more than beta_fast rotations) keep their frequency, pairs above ``high`` (fewer than
    beta_slow) are interpolated. The clamp to dim - 1 (not dim // 2 - 1) is the YaRN
    reference's and transformers', kept so the ramp slope matches theirs.
    """

    if theta <= 1:
        raise ValueError(f"rope_theta={theta!r} is invalid: YaRN needs a base > 1")

    def pair_index(rotations: float) -> float:
        return dim * math.log(original_max_seq_len / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_attention_factor(factor: float, attention_factor: float | None = None,
                          mscale: float | None = None, mscale_all_dim: float | None = None) -> float:
    """YaRN's cos/sin multiplier: explicit, else 0.1 ln(s) + 1, else DeepSeek's mscale ratio."""
    if attention_factor is not None:
        return float(attention_factor)

    def m(weight: float) -> float:
        # Written as 0.1 * weight * ln(s) + 1, the reference's operation order, for equal floats.
        return 1.0 if factor <= 1 else 0.1 * weight * math.log(factor) + 1.0

    if mscale and mscale_all_dim:
        return float(m(mscale) / m(mscale_all_dim))
    return m(1.0)


def _yarn_ramp(low: float, high: float, n: int, device: torch.device | None) -> torch.Tensor:
    """0 below pair ``low``, 1 above ``high``, linear in between: float32 [n]."""
    if low == high:
        high += 0.001  # the reference's guard against 0 / 0; leaves a step
    return ((torch.arange(n, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)


def _yarn(dim: int, theta: float, p: Mapping[str, Any], seq_len: int | None,
          device: torch.device | None) -> tuple[torch.Tensor, float]:
    factor = p["factor"]
    wavelength = theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim)
    extrapolated = 1.0 / wavelength  # [dim // 2], the original frequencies
    interpolated = 1.0 / (factor * wavelength)  # [dim // 2], position interpolation by factor
    low, high = yarn_correction_range(dim, theta, p["beta_fast"], p["beta_slow"],
                                      p["original_max_seq_len"], p["truncate"])
    # keep = 1 on fast pairs (i < low), 0 on slow ones; the blend is written as the reference
    # writes it (keep = 1 - ramp, then 1 - keep) so the float32 result is identical.
    keep = 1 - _yarn_ramp(low, high, dim // 2, device)
    inv_freq = interpolated * (1 - keep) + extrapolated * keep
    return inv_freq, yarn_attention_factor(factor, p["attention_factor"], p["mscale"], p["mscale_all_dim"])


def _llama3(dim: int, theta: float, p: Mapping[str, Any], seq_len: int | None,
            device: torch.device | None) -> tuple[torch.Tensor, float]:
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_seq_len"]
    inv_freq = _unscaled(dim, theta, device)
    wavelength = 2 * math.pi / inv_freq  # [dim // 2]
    # smooth = 0 at wavelength original / low (interpolated), 1 at original / high (kept).
    smooth = (original / wavelength - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    scaled = torch.where(wavelength > original / low, inv_freq / factor, blended)
    return torch.where(wavelength < original / high, inv_freq, scaled), 1.0


def longrope_attention_factor(factor: float, original_max_seq_len: int,
                              attention_factor: float | None = None) -> float:
    """LongRoPE's cos/sin multiplier: explicit, else sqrt(1 + ln(s) / ln(L0)) (1 when s <= 1).

    Phi-3's and transformers' rule, written in their operation order for equal floats. It does not
    depend on the current length: the same factor multiplies the short and the long regime.
    """
    if attention_factor is not None:
        return float(attention_factor)
    if factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(factor) / math.log(original_max_seq_len))


def _longrope(dim: int, theta: float, p: Mapping[str, Any], seq_len: int | None,
              device: torch.device | None) -> tuple[torch.Tensor, float]:
    for key in ("short_factor", "long_factor"):  # the rotary dim is first known here
        if len(p[key]) != dim // 2:
            raise ValueError(f"{WHERE}.{key} is invalid: it has {len(p[key])} entries, but rotary dim {dim} "
                             f"has {dim // 2} pairs (one factor per pair)")
    # seq_len = max position + 1, so this is transformers' torch.max(position_ids) + 1 > original.
    key = "long_factor" if seq_len is not None and seq_len > p["original_max_seq_len"] else "short_factor"
    divisor = torch.tensor(p[key], dtype=torch.float32, device=device)  # [dim // 2]
    wavelength = theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=device).to(torch.float32) / dim)
    inv_freq = 1.0 / (divisor * wavelength)  # transformers' order: divisor * base ** (2i / d), then 1 / x
    return inv_freq, longrope_attention_factor(p["factor"], p["original_max_seq_len"], p["attention_factor"])


SCALINGS: dict[str, ScalingFn] = {
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}


def rope_frequencies(head_dim: int, theta: float, scaling: Mapping[str, Any] | None,
                     seq_len: int | None = None, device: torch.device | str | None = None,
                     ) -> tuple[torch.Tensor, float]:
    """Inverse frequencies (float32 [head_dim // 2]) and the attention factor for cos and sin.

    ``scaling`` is ``normalize_rope_scaling``'s output or None (plain RoPE, factor 1.0).
    ``seq_len`` (max position + 1) matters only for ``dynamic`` and ``longrope`` (short factors up
    to the original length, long ones past it); None means the original length.
    ``head_dim`` is the rotary dimension.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim={head_dim!r} is invalid: RoPE needs a positive even integer")
    if not is_finite_number(theta) or theta <= 0:
        raise ValueError(f"rope_theta={theta!r} is invalid: must be a positive number")
    theta = float(theta)  # a numpy scalar ** tensor would not give a torch tensor
    device = torch.device(device) if device is not None else None
    if scaling is None:
        return _unscaled(head_dim, theta, device), 1.0
    kind = scaling.get("type")
    if not isinstance(kind, str) or kind not in SCALINGS:
        scaling_error("type", kind,
                      "allowed: " + " | ".join(SCALINGS) + " (pass normalize_rope_scaling's output)")
    return SCALINGS[kind](head_dim, theta, scaling, None if seq_len is None else int(seq_len), device)


__all__ = [
    "longrope_attention_factor",
    "normalize_rope_scaling",
    "ntk_base",
    "rope_depends_on_length",
    "rope_frequencies",
    "yarn_attention_factor",
    "yarn_correction_range",
]
