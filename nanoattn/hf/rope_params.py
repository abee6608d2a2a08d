"""RoPE settings in transformers' configs: nanoattn's ``rope_theta`` + ``rope_scaling`` both ways.

Design:
- Scalings map one to one for linear, dynamic, yarn and llama3, written in transformers 5's
  ``rope_parameters``. transformers has no static NTK type; ours only changes the base, so it
  is exported exactly as a plain (``default``) RoPE with that base (``rope_scaling.ntk_base``)
  and comes back as such.
- transformers' ``dynamic`` takes its original length from ``max_position_embeddings``, so a
  dynamic model writes ``original_max_seq_len`` there; other models write ``max_seq_len``.
- p-RoPE (``rope_p < 1``) is transformers' ``proportional`` type with ``partial_rotary_factor``
  = p: the first int(p * head_dim // 2) frequencies kept at their value, the rest 0, the whole
  head rotated; its ``factor`` divides every frequency, which is our ``linear`` scaling (and an
  ``ntk`` base goes in ``rope_theta`` as always). Other scalings with p-RoPE are refused.
- Reading follows transformers' defaults and precedence rules for missing keys. Llama, Llama 4
  and Phi-3 read the same keys; Phi-3 adds ``longrope`` and a partial rotary factor (phi3.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.positional.rope import rotary_dim
from nanoattn.positional.rope_scaling import ntk_base

# transformers' RoPE types that nanoattn computes identically in Llama and Llama 4 (rope_scaling.py).
HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
# Keys of a nanoattn scaling dict that are not the type's own parameters.
COMMON_SCALING_KEYS = ("type", "factor", "original_max_seq_len")


def rope_to_hf(cfg: ModelConfig) -> tuple[int, dict[str, Any]]:
    """(max_position_embeddings, rope_parameters) of a RoPE model with one of ``HF_ROPE_TYPES``,
    or with p-RoPE (``proportional``)."""
    max_len, params = _scaling_to_hf(cfg)
    if cfg.rope_p == 1:
        return max_len, params
    if params["rope_type"] not in ("default", "linear"):
        kind = cfg.rope_scaling["type"]
        raise ValueError(f"model.rope_p={cfg.rope_p!r} with rope_scaling type {kind!r} has "
                         f"no transformers counterpart: p-RoPE exports as transformers' proportional RoPE, "
                         f"which scales only linearly (rope_scaling null, linear or ntk)")
    return max_len, {**params, "rope_type": "proportional", "partial_rotary_factor": float(cfg.rope_p)}


def _scaling_to_hf(cfg: ModelConfig) -> tuple[int, dict[str, Any]]:
    theta, scaling = float(cfg.rope_theta), cfg.rope_scaling
    if scaling is None:
        return cfg.max_seq_len, {"rope_type": "default", "rope_theta": theta}
    kind = scaling["type"]
    if kind == "ntk":
        # Static NTK changes the base and nothing else: a default RoPE with that base is exact.
        base = ntk_base(theta, scaling["factor"], rotary_dim(cfg.head_dim, cfg.rope_fraction))
        return cfg.max_seq_len, {"rope_type": "default", "rope_theta": base}
    params = {"rope_type": kind, "rope_theta": theta, "factor": scaling["factor"]}
    if kind == "dynamic":
        return scaling["original_max_seq_len"], params
    if kind in ("yarn", "llama3"):  # linear needs no length, and transformers warns on the key
        params["original_max_position_embeddings"] = scaling["original_max_seq_len"]
    # The types' own parameters have the same names in transformers; None means "derive it".
    params.update({k: v for k, v in scaling.items() if k not in COMMON_SCALING_KEYS and v is not None})
    return cfg.max_seq_len, params


def hf_rope(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The RoPE mapping of a config, with transformers' precedence: a legacy top-level
    ``rope_scaling`` wins over ``rope_parameters`` (transformers 5's ``convert_rope_params_to_dict``)."""
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise ValueError(f"{where}: rope_scaling={rope!r} is invalid: must be a mapping or null")
    return dict(rope)


def rope_kind(rope: Mapping[str, Any]) -> str:
    return rope.get("rope_type", rope.get("type", "default"))


def partial_rotary_factor(hf: Mapping[str, Any], rope: Mapping[str, Any]) -> Any:
    return rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))


def rope_from_hf(hf: Mapping[str, Any], max_len: int, where: str) -> dict[str, Any]:
    """``rope_theta``, ``rope_scaling`` and ``rope_p`` from a Llama or Llama 4 config; ``rope_theta``
    fills in a missing base. A partial rotary factor is refused (whole heads rotate in these formats)
    but in the ``proportional`` type, where it is p-RoPE's p."""
    rope = hf_rope(hf, where)
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = rope_kind(rope)
    partial = partial_rotary_factor(hf, rope)
    if kind == "proportional":
        factor = rope.get("factor", 1.0)
        linear = None if factor == 1.0 else {"type": "linear", "factor": factor}
        return dict(rope_theta=theta, rope_scaling=linear, rope_p=partial)
    if partial != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={partial!r} is not supported: nanoattn rotates "
                         f"the whole head (partial_rotary_factor=1) in this format")
    if kind not in HF_ROPE_TYPES:
        raise ValueError(f"{where}: rope_type={kind!r} has no nanoattn counterpart; supported: "
                         + " | ".join((*HF_ROPE_TYPES, "proportional")))
    if kind == "default":
        return dict(rope_theta=theta, rope_scaling=None)
    original = rope.get("original_max_position_embeddings", max_len)
    factor = rope.get("factor")
    scaling: dict[str, Any] = {"type": kind, "factor": factor, "original_max_seq_len": original}
    if kind == "dynamic":
        scaling["original_max_seq_len"] = max_len  # transformers' dynamic ignores the original key
    elif kind == "yarn":
        if factor is None:  # transformers then derives it from the two lengths
            scaling["factor"] = max_len / original
        scaling.update(beta_fast=rope.get("beta_fast") or 32.0, beta_slow=rope.get("beta_slow") or 1.0,
                       truncate=rope.get("truncate", True))
        # transformers: an explicit attention_factor wins; mscale counts only with mscale_all_dim.
        if rope.get("attention_factor") is not None:
            scaling["attention_factor"] = rope["attention_factor"]
        elif rope.get("mscale") and rope.get("mscale_all_dim"):
            scaling.update(mscale=rope["mscale"], mscale_all_dim=rope["mscale_all_dim"])
    elif kind == "llama3":
        scaling.update(low_freq_factor=rope.get("low_freq_factor"),
                       high_freq_factor=rope.get("high_freq_factor"))
    return dict(rope_theta=theta, rope_scaling=scaling)
