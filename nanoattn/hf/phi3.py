"""transformers' Phi-3 (``Phi3ForCausalLM``): the format of partial RoPE and of LongRoPE.

A RoPE-only model goes here instead of Llama when it rotates part of each head
(``rope_fraction < 1``, transformers' ``partial_rotary_factor``) or uses a ``longrope`` scaling,
the two things Llama's format lacks. The config that computes our function:
- ``rope_parameters``: ``default`` or ``longrope`` (the only types Phi-3 accepts; a static
  ``ntk`` scaling is a ``default`` RoPE with the NTK base of the rotary dim), with
  ``partial_rotary_factor`` = ``rope_fraction``: both rotate the first int(head_dim * fraction)
  dims of each head, half-split within them, and pass the rest through.
- LongRoPE: ``short_factor``, ``long_factor``, ``factor`` and ``attention_factor`` as ours. Phi-3
  takes the original length from the top-level ``original_max_position_embeddings`` (it wins over
  the one in ``rope_parameters``, and defaults to 4096 when absent), so it is written there too.
  Both switch to the long factors when max position + 1 exceeds it, for the whole sequence.
- Fused weights: ``qkv_proj`` rows are [q | k | v] and ``gate_up_proj`` rows [gate | up] (Phi-3
  computes ``up * silu(gate)``): our ``attn.qkv`` and ``mlp.gate_up`` as they are.
- ``sliding_window=null``; no biases anywhere (a model with ``bias=True`` is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, Rule, linear_rules, only_rope, required
from nanoattn.hf.llama import check_silu, head_sizes
from nanoattn.hf.rope_params import hf_rope, partial_rotary_factor, rope_kind, rope_to_hf

_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attention_dropout")
_LONGROPE_KEYS = ("short_factor", "long_factor", "attention_factor")
# Phi-3's defaults for keys a config may leave out.
_ORIGINAL_DEFAULT = 4096
_LEGACY_LONGROPE = ("su", "yarn")  # Phi-3 configs of transformers 4.x; transformers reads both as longrope


def _rules(cfg: ModelConfig) -> list[Rule]:
    rules = [Rule("tok_emb.weight", ("model.embed_tokens.weight",)),
             Rule("norm.weight", ("model.norm.weight",))]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}", f"model.layers.{i}"
        rules += linear_rules(f"{ours}.attn_norm", (f"{theirs}.input_layernorm",), False)
        rules += linear_rules(f"{ours}.attn.qkv", (f"{theirs}.self_attn.qkv_proj",), False)
        rules += linear_rules(f"{ours}.attn.proj", (f"{theirs}.self_attn.o_proj",), False)
        rules += linear_rules(f"{ours}.mlp_norm", (f"{theirs}.post_attention_layernorm",), False)
        rules += linear_rules(f"{ours}.mlp.gate_up", (f"{theirs}.mlp.gate_up_proj",), False)
        rules += linear_rules(f"{ours}.mlp.down", (f"{theirs}.mlp.down_proj",), False)
    return rules


def _rope_to_hf(cfg: ModelConfig) -> tuple[int, dict[str, Any]]:
    """(original_max_position_embeddings, rope_parameters)."""
    scaling = cfg.rope_scaling
    if scaling is not None and scaling["type"] not in ("ntk", "longrope"):
        raise PHI3.refuse("rope_scaling.type", scaling["type"], "whose only scalings are longrope and ntk "
                          "(a plain RoPE with the NTK base of the rotary dim)")
    rope = {"rope_type": "default", "rope_theta": float(cfg.rope_theta),
            "partial_rotary_factor": float(cfg.rope_fraction)}
    if scaling is None or scaling["type"] == "ntk":
        return cfg.max_seq_len, {**rope, **rope_to_hf(cfg)[1]}
    original = scaling["original_max_seq_len"]
    rope.update(rope_type="longrope", factor=scaling["factor"], original_max_position_embeddings=original,
                **{key: scaling[key] for key in _LONGROPE_KEYS if scaling[key] is not None})
    return original, rope


def _to_config(cfg: ModelConfig) -> dict[str, Any]:
    original, rope = _rope_to_hf(cfg)
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len, "original_max_position_embeddings": original,
        "rope_parameters": rope, "rms_norm_eps": cfg.norm_eps, "sliding_window": None,
        # Phi-3 has attention and residual dropout; ours also drops the embeddings (training only).
        **{key: cfg.dropout for key in _DROPOUTS},
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
    }


def _rope_from_hf(hf: Mapping[str, Any], where: str) -> tuple[float, float, dict[str, Any] | None]:
    """(rope_theta, rope_fraction, rope_scaling) with transformers' precedence and defaults."""
    rope = hf_rope(hf, where)
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    fraction = partial_rotary_factor(hf, rope)
    kind = rope_kind(rope)
    if kind == "default":
        return theta, fraction, None
    if kind != "longrope" and kind not in _LEGACY_LONGROPE:
        raise ValueError(f"{where}: rope_type={kind!r} has no nanoattn counterpart in Phi-3; supported: "
                         f"default | longrope")
    original = hf.get("original_max_position_embeddings", _ORIGINAL_DEFAULT)  # wins, as in transformers
    scaling = {"type": "longrope", "factor": rope.get("factor"), "original_max_seq_len": original,
               **{key: rope.get(key) for key in _LONGROPE_KEYS}}
    return theta, fraction, scaling


def _from_config(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    check_silu(hf, where)
    if hf.get("sliding_window") is not None:
        raise ValueError(f"{where}: sliding_window={hf['sliding_window']!r} is not supported: nanoattn's "
                         f"layers attend to every earlier token (sliding_window=null)")
    dropouts = {key: hf.get(key, 0.0) for key in _DROPOUTS}
    if len(set(dropouts.values())) > 1:
        raise ValueError(f"{where}: {', '.join(f'{k}={v}' for k, v in dropouts.items())} differ: "
                         f"nanoattn has one dropout rate for all three")
    d_model, n_head = head_sizes(hf, where)
    max_len = hf.get("max_position_embeddings", 4096)
    theta, fraction, scaling = _rope_from_hf(hf, where)
    return dict(vocab_size=required(hf, "vocab_size", where), d_model=d_model,
                n_layer=required(hf, "num_hidden_layers", where), n_head=n_head,
                n_kv_head=hf.get("num_key_value_heads") or n_head,
                d_ff=required(hf, "intermediate_size", where), max_seq_len=max_len, pos="rope",
                rope_theta=theta, rope_fraction=fraction, rope_scaling=scaling, norm="rmsnorm",
                norm_eps=hf.get("rms_norm_eps", 1e-5), mlp="swiglu", bias=False,
                tie_embeddings=hf.get("tie_word_embeddings", False), dropout=dropouts["attention_dropout"],
                init_std=hf.get("initializer_range", 0.02))


def _selects(cfg: ModelConfig) -> bool:
    scaling = cfg.rope_scaling or {}
    return only_rope(cfg) and (cfg.rope_fraction != 1 or scaling.get("type") == "longrope")


PHI3 = Family("Phi-3", "phi3", "Phi3ForCausalLM", "pos='rope' with rope_fraction < 1 or a longrope scaling",
              _selects, {**PLAIN_ATTENTION, "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "rope_p": 1.0},
              "model.",
              _to_config, _from_config, _rules)
