"""transformers' Ministral (``MinistralForCausalLM``): the format of a RoPE model with sliding windows.

Ministral is Mistral's Llama-shaped body with a per-layer ``layer_types`` list of
``sliding_attention`` and ``full_attention`` and one ``sliding_window`` W: a query at i sees the
keys j with i - j < W, itself included, as nanoattn's ``sliding_window`` (``model/attention.py``).
So any pattern of one window size and global layers maps, all-local (Mistral) and Gemma-style
alternations alike. Everything else is Llama's mapping (``llama.py``); Ministral has no biases,
so ``bias=True`` is refused, and so are windows of different sizes in one model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, shortest_cycle
from nanoattn.hf.llama import llama_config, llama_fields, llama_rules, whole_head_rope

LAYER_TYPES = {"sliding_attention", "full_attention"}


def _to_config(cfg: ModelConfig) -> dict[str, Any]:
    windows = cfg.layer_window
    sizes = sorted({window for window in windows if window is not None})
    if len(sizes) > 1:
        raise MINISTRAL.refuse("sliding_window", cfg.sliding_window,
                               f"which has one window size, not {sizes}")
    hf = {key: value for key, value in llama_config(cfg).items()
          if key not in ("attention_bias", "mlp_bias")}  # Ministral has no biases (bias=False is required)
    kinds = ["full_attention" if window is None else "sliding_attention" for window in windows]
    return {**hf, "sliding_window": sizes[0], "layer_types": kinds}


def _from_config(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    fields = llama_fields({**hf, "attention_bias": False, "mlp_bias": False}, where)
    types, window = hf.get("layer_types"), hf.get("sliding_window")
    n_layer = fields["n_layer"]
    if types is None:  # transformers' default: every layer sliding when a window is set
        types = ["sliding_attention" if window is not None else "full_attention"] * n_layer
    if not isinstance(types, list) or len(types) < n_layer or not set(types) <= LAYER_TYPES:
        raise ValueError(f"{where}: layer_types={types!r} is invalid: must give 'sliding_attention' or "
                         f"'full_attention' for each of the {n_layer} layers")
    if "sliding_attention" in types and not (isinstance(window, int) and window > 0):
        raise ValueError(f"{where}: sliding_window={window!r} is invalid: sliding layers need a positive "
                         f"window")
    windows = [window if kind == "sliding_attention" else None for kind in types[:n_layer]]
    return {**fields, "sliding_window": shortest_cycle(windows)}


def _selects(cfg: ModelConfig) -> bool:
    return whole_head_rope(cfg) and cfg.qk_norm == "none" and cfg.sliding_window is not None


_NEEDS = {**{field: value for field, value in PLAIN_ATTENTION.items() if field != "sliding_window"},
          "norm": "rmsnorm", "mlp": "swiglu", "bias": False}
MINISTRAL = Family("Ministral", "ministral", "MinistralForCausalLM", "pos='rope' with sliding_window",
                   _selects, _NEEDS, "model.", _to_config, _from_config, llama_rules)
