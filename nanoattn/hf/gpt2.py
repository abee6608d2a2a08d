"""transformers' GPT-2 (``GPT2LMHeadModel``): the format of a learned-position model.

LayerNorm with biases, tanh-GELU (``gelu_new``), MHA only. ``Conv1D`` stores its weights
[in, out], so every projection is transposed; ``c_attn``'s output columns are [q | k | v],
head-major within each: our fused layout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.hf.family import PLAIN_ATTENTION, Family, Rule, linear_rules, required

_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
# GPT-2's "gelu_new" writes out the tanh approximation; "gelu_pytorch_tanh" is torch's kernel of it.
_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
# GPT-2 options nanoattn has no counterpart for, with the only value it can take.
_FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False, "add_cross_attention": False}


def _rules(cfg: ModelConfig) -> list[Rule]:
    rules = [Rule("tok_emb.weight", ("transformer.wte.weight",)),
             Rule("pos.table.weight", ("transformer.wpe.weight",)),
             *linear_rules("norm", ("transformer.ln_f",), True)]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}", f"transformer.h.{i}"
        rules += linear_rules(f"{ours}.attn_norm", (f"{theirs}.ln_1",), True)
        rules += linear_rules(f"{ours}.attn.qkv", (f"{theirs}.attn.c_attn",), True, transpose=True)
        rules += linear_rules(f"{ours}.attn.proj", (f"{theirs}.attn.c_proj",), True, transpose=True)
        rules += linear_rules(f"{ours}.mlp_norm", (f"{theirs}.ln_2",), True)
        rules += linear_rules(f"{ours}.mlp.up", (f"{theirs}.mlp.c_fc",), True, transpose=True)
        rules += linear_rules(f"{ours}.mlp.down", (f"{theirs}.mlp.c_proj",), True, transpose=True)
    return rules


def _to_config(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.n_kv_head != cfg.n_head:
        raise GPT2.refuse("n_kv_head", cfg.n_kv_head,
                          f"which has MHA only: n_kv_head = n_head = {cfg.n_head}")
    return {
        "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
        "n_positions": cfg.max_seq_len,
        "n_inner": cfg.d_ff,  # None means 4 * n_embd in both
        "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
        **{key: cfg.dropout for key in _DROPOUTS}, **_FIXED, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
    }


def _from_config(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in _ACTIVATIONS:
        raise ValueError(f"{where}: activation_function={activation!r} is not supported; allowed: "
                         + " | ".join(_ACTIVATIONS) + " (nanoattn's tanh-approximated GELU)")
    for key, value in _FIXED.items():
        if hf.get(key, value) != value:
            raise ValueError(f"{where}: {key}={hf[key]!r} has no nanoattn counterpart (only {value})")
    dropouts = {key: hf.get(key, 0.1) for key in _DROPOUTS}
    if len(set(dropouts.values())) > 1:
        raise ValueError(f"{where}: {', '.join(f'{k}={v}' for k, v in dropouts.items())} differ: "
                         f"nanoattn has one dropout rate for all three")
    return dict(vocab_size=required(hf, "vocab_size", where), d_model=required(hf, "n_embd", where),
                n_layer=required(hf, "n_layer", where), n_head=required(hf, "n_head", where),
                d_ff=hf.get("n_inner"), max_seq_len=required(hf, "n_positions", where), pos="learned",
                norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5), mlp="gelu", bias=True,
                tie_embeddings=hf.get("tie_word_embeddings", True), dropout=dropouts["attn_pdrop"],
                init_std=hf.get("initializer_range", 0.02))


GPT2 = Family("GPT-2", "gpt2", "GPT2LMHeadModel", "pos='learned'", lambda cfg: cfg.pos == "learned",
              {**PLAIN_ATTENTION, "norm": "layernorm", "mlp": "gelu", "bias": True}, "transformer.",
              _to_config, _from_config, _rules)
