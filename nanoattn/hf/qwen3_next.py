"""transformers' Qwen3-Next (``Qwen3NextForCausalLM``): the format of gated attention.

Qwen3-Next's attention layers are Qwen 3's (QK-norm before RoPE) with the output gate of Qiu et
al. 2025: sigmoid(x W_g) per channel on each head's output before ``o_proj``, nanoattn's
``attn_gate='elementwise'``. A model with that gate and QK-norm exports here, with:
- ``layer_types`` all ``full_attention`` (no Gated DeltaNet layers) and ``num_experts=0`` (every
  MLP dense: SwiGLU ``gate_proj``/``up_proj``/``down_proj``);
- ``q_proj`` rows per head [q_h | g_h]: our fused QKV's query rows interleaved with the gate's
  (``Rule.also`` and ``order``), then ``k_proj`` and ``v_proj``;
- every RMSNorm gain (the blocks', the final one, ``q_norm``, ``k_norm``) stored as 1 + w, w from
  0 (``Rule.offset``);
- ``partial_rotary_factor`` = ``rope_fraction`` (both rotate the first int(head_dim * fraction)
  dims, half-split within them; Qwen3-Next's default is 0.25, so it is always written), and the
  scalings of ``rope_params``.
A headwise gate, no QK-norm or biases have no counterpart and are refused; so is, on import, a
config with linear-attention layers or experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, Rule, linear_rules, only_rope
from nanoattn.hf.llama import llama_config, llama_fields
from nanoattn.hf.rope_params import hf_rope, partial_rotary_factor, rope_to_hf


def _qkv_order(cfg: ModelConfig) -> tuple[int, ...]:
    """Rows of [q | k | v | gate] (ours) in Qwen3-Next's order: [q_0 | g_0 | q_1 | g_1 ... | k | v]."""
    H, Hkv, D = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    gate = (H + 2 * Hkv) * D
    queries = [start + j for h in range(H) for start in (h * D, gate + h * D) for j in range(D)]
    return tuple(queries) + tuple(range(H * D, gate))


def _rules(cfg: ModelConfig) -> list[Rule]:
    H, Hkv, D, F = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.ffn_dim
    rules = [Rule("tok_emb.weight", ("model.embed_tokens.weight",)),
             Rule("norm.weight", ("model.norm.weight",), offset=1.0)]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}", f"model.layers.{i}"
        attn = f"{theirs}.self_attn"
        rules += [Rule(f"{ours}.attn_norm.weight", (f"{theirs}.input_layernorm.weight",), offset=1.0),
                  Rule(f"{ours}.attn.qkv.weight", tuple(f"{attn}.{n}_proj.weight" for n in "qkv"),
                       split=(2 * H * D, Hkv * D, Hkv * D), order=_qkv_order(cfg),
                       also=(f"{ours}.attn.output_gate.proj.weight",)),
                  Rule(f"{ours}.attn.proj.weight", (f"{attn}.o_proj.weight",)),
                  Rule(f"{ours}.mlp_norm.weight", (f"{theirs}.post_attention_layernorm.weight",), offset=1.0)]
        rules += [Rule(f"{ours}.attn.qk_norm.{side}.weight", (f"{attn}.{side}_norm.weight",), offset=1.0)
                  for side in "qk"]
        rules += linear_rules(f"{ours}.mlp.gate_up", (f"{theirs}.mlp.gate_proj", f"{theirs}.mlp.up_proj"),
                              False, split=(F, F))
        rules += linear_rules(f"{ours}.mlp.down", (f"{theirs}.mlp.down_proj",), False)
    return rules


def _to_config(cfg: ModelConfig) -> dict[str, Any]:
    hf = llama_config(cfg)
    del hf["mlp_bias"]  # no biases (bias=False is required)
    _, rope = rope_to_hf(cfg)
    fraction = float(cfg.rope_fraction)
    return {**hf, "rope_parameters": {**rope, "partial_rotary_factor": fraction},
            "partial_rotary_factor": fraction, "layer_types": ["full_attention"] * cfg.n_layer,
            "num_experts": 0, "mlp_only_layers": list(range(cfg.n_layer))}


def _from_config(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    layers = hf.get("num_hidden_layers")
    types = hf.get("layer_types")
    if types is None or any(kind != "full_attention" for kind in types):
        raise ValueError(f"{where}: layer_types={types!r} is not supported: nanoattn computes only "
                         f"Qwen3-Next's full_attention layers (not its Gated DeltaNet linear_attention)")
    sparse = [i for i in range(layers or 0) if i not in (hf.get("mlp_only_layers") or [])
              and hf.get("num_experts", 512) > 0 and (i + 1) % hf.get("decoder_sparse_step", 1) == 0]
    if sparse:
        experts = hf.get("num_experts", 512)
        raise ValueError(f"{where}: layers {sparse} are mixtures of experts (num_experts={experts}), which "
                         f"nanoattn does not compute: all its MLPs are dense")
    if hf.get("attention_bias", False):
        raise ValueError(f"{where}: attention_bias=True is not supported: Qwen3-Next's MLP has no biases and "
                         f"nanoattn's bias flag puts biases in every linear layer or none")
    rope = hf_rope(hf, where)
    fraction = partial_rotary_factor(hf, rope)
    whole = {**hf, "rope_scaling": None, "partial_rotary_factor": 1.0,
             "rope_parameters": {**rope, "partial_rotary_factor": 1.0}}
    return {**llama_fields(whole, where), "rope_fraction": fraction, "qk_norm": "before_rope",
            "attn_gate": "elementwise"}


def _selects(cfg: ModelConfig) -> bool:
    return only_rope(cfg) and cfg.attn_gate != "none"


QWEN3_NEXT = Family("Qwen3-Next", "qwen3_next", "Qwen3NextForCausalLM", "pos='rope' with attn_gate", _selects,
                    {**PLAIN_ATTENTION, "attn_gate": "elementwise", "qk_norm": "before_rope",
                     "norm": "rmsnorm", "mlp": "swiglu", "bias": False, "rope_p": 1.0},
                    "model.", _to_config, _from_config, _rules)
