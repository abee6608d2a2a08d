"""transformers' Qwen 3 (``Qwen3ForCausalLM``): the format of a RoPE model with QK-norm.

Qwen 3 is Llama plus an RMSNorm of every query and key head before RoPE (``q_norm``, ``k_norm``
over head_dim, one gain each, shared by the heads): nanoattn's ``qk_norm='before_rope'``
(``mechanisms/qk_norm.py``). Everything else is Llama's mapping (``llama.py``), with
``use_sliding_window=False`` so every layer attends to every earlier token. Qwen 3's MLP has no
biases, so ``bias=True`` is refused; so is QK-norm after RoPE, which no transformers class computes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, Rule
from nanoattn.hf.llama import llama_config, llama_fields, llama_rules, whole_head_rope


def _rules(cfg: ModelConfig) -> list[Rule]:
    norms = [Rule(f"blocks.{i}.attn.qk_norm.{side}.weight",
                  (f"model.layers.{i}.self_attn.{side}_norm.weight",))
             for i in range(cfg.n_layer) for side in "qk"]
    return llama_rules(cfg) + norms


def _to_config(cfg: ModelConfig) -> dict[str, Any]:
    hf = llama_config(cfg)
    del hf["mlp_bias"]  # Qwen 3 has no MLP biases (bias=False is required)
    return {**hf, "use_sliding_window": False, "layer_types": ["full_attention"] * cfg.n_layer}


def _from_config(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    if hf.get("attention_bias", False):
        raise ValueError(f"{where}: attention_bias=True is not supported: Qwen 3's MLP has no biases and "
                         f"nanoattn's bias flag puts biases in every linear layer or none")
    if hf.get("use_sliding_window", False):
        raise ValueError(f"{where}: use_sliding_window=True is not supported: nanoattn's layers attend "
                         f"to every earlier token")
    return {**llama_fields(hf, where), "qk_norm": "before_rope"}


def _selects(cfg: ModelConfig) -> bool:
    return whole_head_rope(cfg) and cfg.qk_norm != "none"


QWEN3 = Family("Qwen 3", "qwen3", "Qwen3ForCausalLM", "pos='rope' with qk_norm", _selects,
               {**PLAIN_ATTENTION, "qk_norm": "before_rope", "norm": "rmsnorm", "mlp": "swiglu",
                "bias": False},
               "model.", _to_config, _from_config, _rules)
