"""Validation of a RoPE scaling mapping: ``normalize_rope_scaling`` checks a user's mapping once
(one-line ``ValueError`` naming the key) and fills every default, so the frequency functions of
``rope_scaling.py`` read a complete, plain dict. Types and their meaning: ``rope_scaling.py``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

WHERE = "model.rope_scaling"

# transformers' spellings accepted on input and rewritten to ours.
_ALIASES = {"rope_type": "type", "original_max_position_embeddings": "original_max_seq_len"}

# Per-type parameters beyond the common ``type``, ``factor``, ``original_max_seq_len``, with defaults.
_EXTRA_DEFAULTS: dict[str, dict[str, Any]] = {
    "linear": {},
    "ntk": {},
    "dynamic": {},
    "yarn": {
        "beta_fast": 32.0,  # pairs rotating more than this over the original length: kept
        "beta_slow": 1.0,  # pairs rotating less than this: interpolated by factor
        "attention_factor": None,  # None: derived from factor (and mscale / mscale_all_dim)
        "mscale": None,
        "mscale_all_dim": None,
        "truncate": True,  # floor/ceil the ramp ends (in transformers 4.57+; gpt-oss sets False)
    },
    "llama3": {"low_freq_factor": 1.0, "high_freq_factor": 4.0},
    "longrope": {
        "short_factor": None,  # required: one divisor per rotated pair while seq_len <= original
        "long_factor": None,  # required: one divisor per rotated pair once seq_len > original
        "attention_factor": None,  # None: sqrt(1 + ln(factor) / ln(original_max_seq_len))
    },
}
SCALING_TYPES = tuple(_EXTRA_DEFAULTS)  # the types rope_scaling.py computes, one function each

def scaling_error(key: str, value: Any, why: str) -> NoReturn:
    raise ValueError(f"{WHERE}.{key}={value!r} is invalid: {why}")


def is_finite_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _number(key: str, value: Any, *, above: float | None = None, at_least: float | None = None) -> float:
    if not is_finite_number(value):
        scaling_error(key, value, "must be a finite number")
    if at_least is not None and value < at_least:
        scaling_error(key, value, f"must be >= {at_least:g}")
    if above is not None and value <= above:
        scaling_error(key, value, f"must be > {above:g}")
    return float(value)


def _positive_int(key: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        scaling_error(key, value, "must be a positive integer")
    return int(value)


def _optional_positive(key: str, value: Any) -> float | None:
    return None if value is None else _number(key, value, above=0.0)


def _unalias(scaling: Mapping[str, Any]) -> dict[str, Any]:
    """Rewrite transformers' key spellings to ours; both spellings must agree if both are given."""
    out: dict[str, Any] = {}
    for key, value in scaling.items():
        name = _ALIASES.get(key, key)
        if name in out and out[name] != value:
            scaling_error(key, value, f"conflicts with {name}={out[name]!r} (the same parameter)")
        out[name] = value
    return out


def _check_yarn(params: dict[str, Any]) -> None:
    for key in ("beta_fast", "beta_slow"):
        params[key] = _number(key, params[key], above=0.0)
    if params["beta_fast"] <= params["beta_slow"]:
        scaling_error("beta_fast", params["beta_fast"], f"must be > beta_slow={params['beta_slow']:g}")
    for key in ("attention_factor", "mscale", "mscale_all_dim"):
        params[key] = _optional_positive(key, params[key])
    # transformers uses mscale only when both are set and ignores both when attention_factor is
    # set; we refuse those combinations instead of silently dropping a value the user wrote.
    if (params["mscale"] is None) != (params["mscale_all_dim"] is None):
        given = "mscale" if params["mscale"] is not None else "mscale_all_dim"
        scaling_error(given, params[given], "mscale and mscale_all_dim must be given together")
    if params["attention_factor"] is not None and params["mscale"] is not None:
        scaling_error("attention_factor", params["attention_factor"],
              "give attention_factor or mscale + mscale_all_dim, not both")
    if not isinstance(params["truncate"], bool):
        scaling_error("truncate", params["truncate"], "must be true or false")


def _check_llama3(params: dict[str, Any]) -> None:
    for key in ("low_freq_factor", "high_freq_factor"):
        params[key] = _number(key, params[key], above=0.0)
    if params["high_freq_factor"] <= params["low_freq_factor"]:
        scaling_error("high_freq_factor", params["high_freq_factor"],
              f"must be > low_freq_factor={params['low_freq_factor']:g}")


def _pair_factors(key: str, value: Any) -> list[float]:
    """A LongRoPE factor list: a non-empty sequence of positive numbers, as a plain list of floats."""
    if value is None:
        raise ValueError(f"{WHERE}.{key} is missing: type 'longrope' needs a list of positive numbers, "
                         "one per rotated pair (rotary dim / 2)")
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or len(value) == 0:
        scaling_error(key, value, "must be a non-empty list of positive numbers, one per rotated pair "
                          "(rotary dim / 2)")
    # float(x) keeps the value: torch.tensor(..., dtype=float32) then rounds it as transformers does.
    return [_number(f"{key}[{i}]", x, above=0.0) for i, x in enumerate(value)]


def _check_longrope(params: dict[str, Any]) -> None:
    for key in ("short_factor", "long_factor"):
        params[key] = _pair_factors(key, params[key])
    short, long = len(params["short_factor"]), len(params["long_factor"])
    if short != long:
        raise ValueError(f"{WHERE}.long_factor is invalid: it has {long} entries but short_factor has "
                         f"{short}; both need one per rotated pair (rotary dim / 2)")
    params["attention_factor"] = _optional_positive("attention_factor", params["attention_factor"])
    if params["attention_factor"] is None and params["factor"] > 1 and params["original_max_seq_len"] < 2:
        scaling_error("original_max_seq_len", params["original_max_seq_len"],
              "must be >= 2 for longrope's attention factor sqrt(1 + ln(factor) / ln(original_max_seq_len)); "
              "or give attention_factor")


_TYPE_CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "yarn": _check_yarn, "llama3": _check_llama3, "longrope": _check_longrope}


def normalize_rope_scaling(scaling: Mapping[str, Any] | None, max_seq_len: int) -> dict[str, Any] | None:
    """Validate a RoPE scaling mapping and return a plain dict with every parameter filled in.

    ``max_seq_len`` is the model's training context: the default ``original_max_seq_len``, and
    for ``longrope`` without a ``factor`` the numerator of transformers' default factor
    ``max_seq_len / original_max_seq_len`` (its ``max_position_embeddings / original``).
    Accepts transformers' ``rope_type`` / ``original_max_position_embeddings`` spellings.
    Idempotent: normalising a normalised dict returns an equal dict.
    """
    if scaling is None:
        return None
    if not isinstance(scaling, Mapping):
        raise ValueError(f"{WHERE}={scaling!r} is invalid: must be a mapping such as "
                         "{'type': 'linear', 'factor': 2.0}, or null")
    allowed_types = " | ".join(SCALING_TYPES)
    params = _unalias(scaling)
    if "type" not in params:
        raise ValueError(f"{WHERE}.type is missing: allowed: {allowed_types}")
    kind = params["type"]
    if not isinstance(kind, str) or kind not in SCALING_TYPES:
        scaling_error("type", kind, f"allowed: {allowed_types}")
    defaults = {"type": kind, "factor": None, "original_max_seq_len": None, **_EXTRA_DEFAULTS[kind]}
    unknown = [key for key in params if key not in defaults]
    if unknown:
        allowed_keys = " | ".join(defaults)
        scaling_error(unknown[0], params[unknown[0]],
                      f"unknown key for type {kind!r}; allowed: {allowed_keys}")
    # LongRoPE may leave the factor out (or null), as transformers' does: then it is the ratio of
    # the model's context to the original one.
    derive_factor = kind == "longrope" and params.get("factor") is None
    if "factor" not in params and not derive_factor:
        raise ValueError(f"{WHERE}.factor is missing: type {kind!r} needs a number >= 1")
    out = {**defaults, **params}
    if not derive_factor:
        # factor = 1 is allowed, as in transformers: the identity for every type but dynamic (which
        # then still grows the base by L / L0 past the original length).
        out["factor"] = _number("factor", out["factor"], at_least=1.0)
    if out["original_max_seq_len"] is None:
        out["original_max_seq_len"] = max_seq_len
    out["original_max_seq_len"] = _positive_int("original_max_seq_len", out["original_max_seq_len"])
    if derive_factor:
        original = out["original_max_seq_len"]
        out["factor"] = max_seq_len / original  # the same float division as transformers'
        if not out["factor"] >= 1:
            raise ValueError(f"{WHERE}.factor is missing: type 'longrope' then takes max_seq_len / "
                             f"original_max_seq_len = {max_seq_len} / {original}, which must be >= 1; "
                             "give factor")
    if kind in _TYPE_CHECKS:
        _TYPE_CHECKS[kind](out)
    return out


def rope_depends_on_length(scaling: Mapping[str, Any] | None) -> bool:
    """True when inv_freq depends on the current sequence length (``dynamic`` and ``longrope``)."""
    return scaling is not None and scaling.get("type", scaling.get("rope_type")) in ("dynamic", "longrope")
