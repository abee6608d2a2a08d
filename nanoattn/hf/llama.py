"""transformers' Llama (``LlamaForCausalLM``): the format of a plain RoPE model.

RMSNorm, SwiGLU, MHA/GQA/MQA via ``num_key_value_heads``, whole-head RoPE with every scaling of
``rope_params``. nanoattn and transformers' Llama both use the half-split (rotate_half) layout,
so q/k rows are copied unpermuted (the tests check logits). p-RoPE is transformers'
``proportional`` RoPE type (rope_params.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, Rule, linear_rules, only_rope, required
from nanoattn.hf.rope_params import rope_from_hf, rope_to_hf


def llama_rules(cfg: ModelConfig, *, mlp: str = "mlp", order: tuple[int, ...] | None = None) -> list[Rule]:
    """The Llama-shaped body that Llama, Llama 4 and Qwen 3 share: ``mlp`` is the MLP's key
    (Llama 4: ``feed_forward``), ``order`` a permutation of the fused QKV rows (interleaved_order)."""
    H, Hkv, D, F = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.ffn_dim
    rules = [Rule("tok_emb.weight", ("model.embed_tokens.weight",)),
             Rule("norm.weight", ("model.norm.weight",))]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}", f"model.layers.{i}"
        rules += linear_rules(f"{ours}.attn_norm", (f"{theirs}.input_layernorm",), False)
        rules += linear_rules(f"{ours}.attn.qkv", tuple(f"{theirs}.self_attn.{n}_proj" for n in "qkv"),
                              cfg.bias, split=(H * D, Hkv * D, Hkv * D), order=order)
        rules += linear_rules(f"{ours}.attn.proj", (f"{theirs}.self_attn.o_proj",), cfg.bias)
        rules += linear_rules(f"{ours}.mlp_norm", (f"{theirs}.post_attention_layernorm",), False)
        rules += linear_rules(f"{ours}.mlp.gate_up", (f"{theirs}.{mlp}.gate_proj", f"{theirs}.{mlp}.up_proj"),
                              cfg.bias, split=(F, F))
        rules += linear_rules(f"{ours}.mlp.down", (f"{theirs}.{mlp}.down_proj",), cfg.bias)
    return rules


def llama_config(cfg: ModelConfig) -> dict[str, Any]:
    max_len, rope = rope_to_hf(cfg)
    return {
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model, "intermediate_size": cfg.ffn_dim,
        "num_hidden_layers": cfg.n_layer, "num_attention_heads": cfg.n_head,
        "num_key_value_heads": cfg.n_kv_head, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": max_len, "rope_parameters": rope, "rms_norm_eps": cfg.norm_eps,
        # nanoattn's bias flag covers every linear layer: Llama's q/k/v/o and its MLP.
        "attention_bias": cfg.bias, "mlp_bias": cfg.bias,
        # Llama has only attention dropout; our residual and embedding dropout (training only) is lost.
        "attention_dropout": cfg.dropout,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
    }


def check_silu(hf: Mapping[str, Any], where: str) -> None:
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act={hf['hidden_act']!r} is not supported: "
                         f"nanoattn's SwiGLU uses 'silu'")


def head_sizes(hf: Mapping[str, Any], where: str) -> tuple[int, int]:
    """(hidden_size, num_attention_heads), refusing a head_dim other than their ratio."""
    d_model, n_head = required(hf, "hidden_size", where), required(hf, "num_attention_heads", where)
    head_dim = hf.get("head_dim") or d_model // n_head
    if head_dim * n_head != d_model:
        raise ValueError(f"{where}: head_dim={head_dim} is not supported: nanoattn needs head_dim = "
                         f"hidden_size / num_attention_heads = {d_model / n_head:g}")
    return d_model, n_head


def llama_fields(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    check_silu(hf, where)
    attention_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise ValueError(f"{where}: attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
                         f"supported: nanoattn's bias flag puts biases in every linear layer or none")
    d_model, n_head = head_sizes(hf, where)
    max_len = hf.get("max_position_embeddings", 2048)
    return dict(vocab_size=required(hf, "vocab_size", where), d_model=d_model,
                n_layer=required(hf, "num_hidden_layers", where), n_head=n_head,
                n_kv_head=hf.get("num_key_value_heads") or n_head,
                d_ff=required(hf, "intermediate_size", where),
                max_seq_len=max_len, pos="rope", **rope_from_hf(hf, max_len, where), norm="rmsnorm",
                norm_eps=hf.get("rms_norm_eps", 1e-6), mlp="swiglu", bias=attention_bias,
                tie_embeddings=hf.get("tie_word_embeddings", False), dropout=hf.get("attention_dropout", 0.0),
                init_std=hf.get("initializer_range", 0.02))


def whole_head_rope(cfg: ModelConfig) -> bool:
    """RoPE-only over whole heads without LongRoPE: Llama's and Qwen 3's positions (partial RoPE and
    LongRoPE go to Phi-3, phi3.py)."""
    scaling = cfg.rope_scaling or {}
    return only_rope(cfg) and cfg.rope_fraction == 1 and scaling.get("type") != "longrope"


def _selects(cfg: ModelConfig) -> bool:
    # With QK-norm: Qwen 3 (qwen3.py); with sliding windows: Ministral (ministral.py).
    return whole_head_rope(cfg) and cfg.qk_norm == "none" and cfg.sliding_window is None


LLAMA = Family("Llama", "llama", "LlamaForCausalLM", "pos='rope'", _selects,
               {**PLAIN_ATTENTION, "norm": "rmsnorm", "mlp": "swiglu"}, "model.",
               llama_config, llama_fields, llama_rules)
