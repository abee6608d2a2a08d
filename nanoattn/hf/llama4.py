"""transformers' Llama 4 text model (``Llama4ForCausalLM``): the format of a RoPE/NoPE layout.

A model whose layers are each RoPE or NoPE, at least one NoPE (``pos=[rope, rope, rope, nope]``
is Llama 4's iRoPE, ``pos='nope'`` has no RoPE layer), with Llama 4's query temperature on the
NoPE layers when ``temperature_floor_scale`` is set. The config that computes our function:
- ``no_rope_layers``: one entry per layer, 1 = RoPE, 0 = NoPE (the name reads backwards).
- ``attn_temperature_tuning`` = a temperature is set; ``floor_scale``, ``attn_scale`` as ours.
  transformers applies it on NoPE layers only, after RoPE, as ours does.
- Dense layers only: ``moe_layers=[]``; the dense SwiGLU width is ``intermediate_size_mlp``.
- ``use_qk_norm=False`` (transformers' default L2-normalises q and k on RoPE layers).
- ``attention_chunk_size=null``, so RoPE layers attend to every earlier token (transformers'
  default 8192 makes them chunked-local), and ``layer_types`` all ``full_attention``.
- Llama 4 rotates interleaved pairs (2i, 2i + 1) as complex numbers; nanoattn rotates the
  half-split pairs (i, i + D/2). The q and k rows of every head are permuted on export and
  back on import (``interleaved_order``): the same function. NoPE layers are permuted too,
  which changes nothing, so every layer has one rule.
Llama 4's MLP has no biases, so a model with ``bias=True`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, Rule, interleaved_order, required, shortest_cycle
from nanoattn.hf.llama import check_silu, head_sizes, llama_rules
from nanoattn.hf.rope_params import rope_from_hf, rope_to_hf

LAYER_KINDS = ("rope", "nope")
# What transformers uses for floor_scale when the temperature is off: the value never acts then.
_FLOOR_SCALE_DEFAULT = 8192


def _rules(cfg: ModelConfig) -> list[Rule]:
    order = interleaved_order(cfg.n_head, cfg.n_kv_head, cfg.head_dim)
    return llama_rules(cfg, mlp="feed_forward", order=order)


def _to_config(cfg: ModelConfig) -> dict[str, Any]:
    kinds = cfg.layer_pos
    if "rope" in kinds:
        if cfg.rope_fraction != 1:
            raise LLAMA4.refuse("rope_fraction", cfg.rope_fraction,
                                "which rotates whole heads: rope_fraction=1.0")
        if cfg.rope_scaling is not None and cfg.rope_scaling["type"] == "longrope":
            raise LLAMA4.refuse("rope_scaling.type", "longrope", "which has no longrope: that is Phi-3's, "
                                "for RoPE-only models")
    max_len, rope = rope_to_hf(cfg)
    floor_scale = cfg.temperature_floor_scale
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_dim, "intermediate_size_mlp": cfg.ffn_dim, "moe_layers": [],
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": max_len, "rope_parameters": rope, "rms_norm_eps": cfg.norm_eps,
        "no_rope_layers": [int(kind == "rope") for kind in kinds], "use_qk_norm": False,
        "attention_chunk_size": None, "layer_types": ["full_attention"] * cfg.n_layer,
        "attn_temperature_tuning": floor_scale is not None,
        "floor_scale": _FLOOR_SCALE_DEFAULT if floor_scale is None else floor_scale,
        "attn_scale": float(cfg.temperature_attn_scale),
        "attention_bias": False, "attention_dropout": cfg.dropout,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
    }


def _layer_kinds(hf: Mapping[str, Any], n_layer: int, where: str) -> list[str]:
    flags = hf.get("no_rope_layers")
    if not flags:  # transformers' default: every no_rope_layer_interval-th layer is NoPE
        interval = hf.get("no_rope_layer_interval", 4)
        flags = [int((i + 1) % interval != 0) for i in range(n_layer)]
    if not isinstance(flags, list) or len(flags) < n_layer or any(f not in (0, 1) for f in flags):
        raise ValueError(f"{where}: no_rope_layers={flags!r} is invalid: must give 1 (RoPE) or 0 (NoPE) "
                         f"for each of the {n_layer} layers")
    return [LAYER_KINDS[0] if flag else LAYER_KINDS[1] for flag in flags[:n_layer]]


def _check_dense_full(hf: Mapping[str, Any], kinds: list[str], where: str) -> None:
    n_layer = len(kinds)
    moe = hf.get("moe_layers")
    if moe is None:  # transformers' default: every interleave_moe_layer_step-th layer
        step = hf.get("interleave_moe_layer_step", 1)
        moe = list(range(step - 1, n_layer, step))
    if moe:
        raise ValueError(f"{where}: moe_layers={moe} is not supported: nanoattn's layers are dense "
                         f"(moe_layers=[])")
    if hf.get("use_qk_norm", True) and "rope" in kinds:
        raise ValueError(f"{where}: use_qk_norm=True is not supported: nanoattn has no query/key norm")
    chunk = hf.get("attention_chunk_size", 8192)
    types = hf.get("layer_types") or ["chunked_attention" if kind == "rope" and chunk is not None
                                      else "full_attention" for kind in kinds]
    local = next((i for i, t in enumerate(types[:n_layer]) if t != "full_attention"), None)
    if local is not None:
        raise ValueError(f"{where}: layer {local} is {types[local]!r} (attention_chunk_size={chunk!r}): "
                         f"not supported, nanoattn's layers attend to every earlier token "
                         f"(attention_chunk_size=null)")


def _from_config(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    check_silu(hf, where)
    if hf.get("attention_bias", False):
        raise ValueError(f"{where}: attention_bias=True is not supported: Llama 4's MLP has no biases and "
                         f"nanoattn's bias flag puts biases in every linear layer or none")
    d_model, n_head = head_sizes(hf, where)
    n_layer = required(hf, "num_hidden_layers", where)
    kinds = _layer_kinds(hf, n_layer, where)
    _check_dense_full(hf, kinds, where)
    max_len = hf.get("max_position_embeddings", 4096 * 32)
    rope = rope_from_hf({"rope_theta": 500000.0, **hf}, max_len, where)
    if "rope" not in kinds:
        rope.update(rope_scaling=None, rope_p=1.0)  # nothing rotates: a scaling would be refused
    tuning = hf.get("attn_temperature_tuning", True)
    return dict(vocab_size=required(hf, "vocab_size", where), d_model=d_model, n_layer=n_layer,
                n_head=n_head, n_kv_head=hf.get("num_key_value_heads") or n_head,
                d_ff=required(hf, "intermediate_size_mlp", where), max_seq_len=max_len,
                pos=shortest_cycle(kinds), **rope,
                temperature_floor_scale=hf.get("floor_scale", _FLOOR_SCALE_DEFAULT) if tuning else None,
                temperature_attn_scale=hf.get("attn_scale", 0.1), norm="rmsnorm",
                norm_eps=hf.get("rms_norm_eps", 1e-5), mlp="swiglu", bias=False,
                tie_embeddings=hf.get("tie_word_embeddings", False), dropout=hf.get("attention_dropout", 0.0),
                init_std=hf.get("initializer_range", 0.02))


def _selects(cfg: ModelConfig) -> bool:
    kinds = set(cfg.layer_pos)
    return "nope" in kinds and kinds <= set(LAYER_KINDS)


LLAMA4 = Family("Llama 4", "llama4_text", "Llama4ForCausalLM", "a pos of 'rope' and 'nope' layers", _selects,
                {**PLAIN_ATTENTION, "norm": "rmsnorm", "mlp": "swiglu", "bias": False}, "model.",
                _to_config, _from_config, _rules)
