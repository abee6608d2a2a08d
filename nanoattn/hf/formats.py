"""transformers' two model formats nanoattn maps to exactly: Llama and GPT-2.

Design:
- The family is chosen by the positional encoding: ``pos='rope'`` is Llama (RMSNorm, SwiGLU,
  MHA/GQA/MQA via ``num_key_value_heads``), ``pos='learned'`` is GPT-2 (LayerNorm with biases,
  tanh-GELU, MHA). Every other choice a family fixes is checked, and a model with no exact
  counterpart is refused with a one-line ``ValueError`` naming the field; nothing is approximated.
- Weights move through one table of rules per family (``Rule``) that both directions read, so
  export and import cannot disagree. A rule names our tensor, theirs, an optional row split
  (our fused QKV rows [q | k | v] and SwiGLU rows [gate | up] become separate projections) and
  a transpose (GPT-2's ``Conv1D`` stores [in, out], ``nn.Linear`` [out, in]).
- RoPE: nanoattn and transformers' Llama both use the half-split (rotate_half) layout, so q/k
  rows are copied unpermuted (the tests check logits). Scalings map one to one for linear,
  dynamic, yarn and llama3, written in transformers 5's ``rope_parameters``. transformers has
  no static NTK type; ours only changes the base, so it is exported exactly as a plain
  (``default``) RoPE with that base (``rope_scaling.ntk_base``) and comes back as such.
- transformers' ``dynamic`` takes its original length from ``max_position_embeddings``, so a
  dynamic model writes ``original_max_seq_len`` there; other models write ``max_seq_len``.
- Reading a config follows transformers' defaults and precedence rules for missing keys.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.positional.rope_scaling import ntk_base
from nanoattn.validation import is_int

# transformers' RoPE types that nanoattn computes identically (see rope_scaling.py).
HF_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "llama3")
# Keys of a nanoattn scaling dict that are not the type's own parameters.
_COMMON_SCALING_KEYS = ("type", "factor", "original_max_seq_len")


# ----------------------------------------------------------------------------- weight rules


@dataclass(frozen=True)
class Rule:
    """How one of our tensors is stored in transformers' format (both directions read it)."""

    ours: str  # a GPT state_dict key
    theirs: tuple[str, ...]  # the transformers keys it becomes, in row order
    split: tuple[int, ...] | None = None  # rows of ours per key in theirs (fused projections)
    transpose: bool = False  # GPT-2's Conv1D weight is [in, out]


def _linear_rules(ours: str, theirs: tuple[str, ...], bias: bool, *,
                  split: tuple[int, ...] | None = None, transpose: bool = False) -> list[Rule]:
    """The weight (and bias) of one linear layer; Conv1D biases are not transposed."""
    rules = [Rule(f"{ours}.weight", tuple(f"{t}.weight" for t in theirs), split, transpose)]
    if bias:
        rules.append(Rule(f"{ours}.bias", tuple(f"{t}.bias" for t in theirs), split))
    return rules


def _llama_rules(cfg: ModelConfig) -> list[Rule]:
    H, Hkv, D, F = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.ffn_dim
    rules = [Rule("tok_emb.weight", ("model.embed_tokens.weight",)),
             Rule("norm.weight", ("model.norm.weight",))]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}", f"model.layers.{i}"
        rules += _linear_rules(f"{ours}.attn_norm", (f"{theirs}.input_layernorm",), False)
        rules += _linear_rules(f"{ours}.attn.qkv", tuple(f"{theirs}.self_attn.{n}_proj" for n in "qkv"),
                               cfg.bias, split=(H * D, Hkv * D, Hkv * D))
        rules += _linear_rules(f"{ours}.attn.proj", (f"{theirs}.self_attn.o_proj",), cfg.bias)
        rules += _linear_rules(f"{ours}.mlp_norm", (f"{theirs}.post_attention_layernorm",), False)
        rules += _linear_rules(f"{ours}.mlp.gate_up", (f"{theirs}.mlp.gate_proj", f"{theirs}.mlp.up_proj"),
                               cfg.bias, split=(F, F))
        rules += _linear_rules(f"{ours}.mlp.down", (f"{theirs}.mlp.down_proj",), cfg.bias)
    return rules


def _gpt2_rules(cfg: ModelConfig) -> list[Rule]:
    rules = [Rule("tok_emb.weight", ("transformer.wte.weight",)),
             Rule("pos.table.weight", ("transformer.wpe.weight",)),
             *_linear_rules("norm", ("transformer.ln_f",), True)]
    for i in range(cfg.n_layer):
        ours, theirs = f"blocks.{i}", f"transformer.h.{i}"
        rules += _linear_rules(f"{ours}.attn_norm", (f"{theirs}.ln_1",), True)
        # c_attn's output columns are [q | k | v], head-major within each: our fused layout, transposed.
        rules += _linear_rules(f"{ours}.attn.qkv", (f"{theirs}.attn.c_attn",), True, transpose=True)
        rules += _linear_rules(f"{ours}.attn.proj", (f"{theirs}.attn.c_proj",), True, transpose=True)
        rules += _linear_rules(f"{ours}.mlp_norm", (f"{theirs}.ln_2",), True)
        rules += _linear_rules(f"{ours}.mlp.up", (f"{theirs}.mlp.c_fc",), True, transpose=True)
        rules += _linear_rules(f"{ours}.mlp.down", (f"{theirs}.mlp.c_proj",), True, transpose=True)
    return rules


# ----------------------------------------------------------------------------- config mapping


def _rope_to_hf(cfg: ModelConfig) -> tuple[int, dict[str, Any]]:
    """(max_position_embeddings, rope_parameters) of a RoPE model."""
    theta, scaling = float(cfg.rope_theta), cfg.rope_scaling
    if scaling is None:
        return cfg.max_seq_len, {"rope_type": "default", "rope_theta": theta}
    kind = scaling["type"]
    if kind == "ntk":
        # Static NTK changes the base and nothing else: a default RoPE with that base is exact.
        base = ntk_base(theta, scaling["factor"], cfg.head_dim)
        return cfg.max_seq_len, {"rope_type": "default", "rope_theta": base}
    params = {"rope_type": kind, "rope_theta": theta, "factor": scaling["factor"]}
    if kind == "dynamic":
        return scaling["original_max_seq_len"], params
    if kind in ("yarn", "llama3"):  # linear needs no length, and transformers warns on the key
        params["original_max_position_embeddings"] = scaling["original_max_seq_len"]
    # The types' own parameters have the same names in transformers; None means "derive it".
    params.update({k: v for k, v in scaling.items() if k not in _COMMON_SCALING_KEYS and v is not None})
    return cfg.max_seq_len, params


def _rope_from_hf(hf: Mapping[str, Any], max_len: int, where: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, nanoattn rope_scaling) from a Llama config, with transformers' precedence.

    A legacy top-level ``rope_scaling`` wins over ``rope_parameters`` and ``rope_theta`` fills in
    a missing base, as in transformers 5's ``convert_rope_params_to_dict``.
    """
    rope = hf.get("rope_scaling") or hf.get("rope_parameters") or {}
    if not isinstance(rope, Mapping):
        raise ValueError(f"{where}: rope_scaling={rope!r} is invalid: must be a mapping or null")
    rope = dict(rope)
    theta = float(rope.get("rope_theta", hf.get("rope_theta", 10000.0)))
    kind = rope.get("rope_type", rope.get("type", "default"))
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise ValueError(f"{where}: partial_rotary_factor={partial!r} is not supported: nanoattn rotates "
                         f"the whole head (partial_rotary_factor=1)")
    if kind not in HF_ROPE_TYPES:
        raise ValueError(f"{where}: rope_type={kind!r} has no nanoattn counterpart; supported: "
                         + " | ".join(HF_ROPE_TYPES))
    if kind == "default":
        return theta, None
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
    return theta, scaling


def _llama_config(cfg: ModelConfig) -> dict[str, Any]:
    max_len, rope = _rope_to_hf(cfg)
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


def _llama_fields(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{where}: hidden_act={hf['hidden_act']!r} is not supported: "
                         f"nanoattn's SwiGLU uses 'silu'")
    attention_bias, mlp_bias = hf.get("attention_bias", False), hf.get("mlp_bias", False)
    if attention_bias != mlp_bias:
        raise ValueError(f"{where}: attention_bias={attention_bias} with mlp_bias={mlp_bias} is not "
                         f"supported: nanoattn's bias flag puts biases in every linear layer or none")
    d_model, n_head = _required(hf, "hidden_size", where), _required(hf, "num_attention_heads", where)
    head_dim = hf.get("head_dim") or d_model // n_head
    if head_dim * n_head != d_model:
        raise ValueError(f"{where}: head_dim={head_dim} is not supported: nanoattn needs head_dim = "
                         f"hidden_size / num_attention_heads = {d_model / n_head:g}")
    max_len = hf.get("max_position_embeddings", 2048)
    theta, scaling = _rope_from_hf(hf, max_len, where)
    return dict(vocab_size=_required(hf, "vocab_size", where), d_model=d_model,
                n_layer=_required(hf, "num_hidden_layers", where), n_head=n_head,
                n_kv_head=hf.get("num_key_value_heads") or n_head,
                d_ff=_required(hf, "intermediate_size", where),
                max_seq_len=max_len, pos="rope", rope_theta=theta, rope_scaling=scaling, norm="rmsnorm",
                norm_eps=hf.get("rms_norm_eps", 1e-6), mlp="swiglu", bias=attention_bias,
                tie_embeddings=hf.get("tie_word_embeddings", False), dropout=hf.get("attention_dropout", 0.0),
                init_std=hf.get("initializer_range", 0.02))


_GPT2_DROPOUTS = ("resid_pdrop", "embd_pdrop", "attn_pdrop")
# GPT-2's "gelu_new" writes out the tanh approximation; "gelu_pytorch_tanh" is torch's kernel of it.
_GPT2_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh")
# GPT-2 options nanoattn has no counterpart for, with the only value it can take.
_GPT2_FIXED = {"scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
               "add_cross_attention": False}


def _gpt2_config(cfg: ModelConfig) -> dict[str, Any]:
    if cfg.n_kv_head != cfg.n_head:
        raise ValueError(f"model.n_kv_head={cfg.n_kv_head} has no counterpart in transformers' GPT-2 "
                         f"format (pos='learned' exports as GPT-2, which has MHA only: n_kv_head = "
                         f"n_head = {cfg.n_head})")
    return {
        "vocab_size": cfg.vocab_size, "n_embd": cfg.d_model, "n_layer": cfg.n_layer, "n_head": cfg.n_head,
        "n_positions": cfg.max_seq_len,
        "n_inner": cfg.d_ff,  # None means 4 * n_embd in both
        "activation_function": "gelu_new", "layer_norm_epsilon": cfg.norm_eps,
        **{key: cfg.dropout for key in _GPT2_DROPOUTS}, **_GPT2_FIXED, "reorder_and_upcast_attn": False,
        "tie_word_embeddings": cfg.tie_embeddings, "initializer_range": cfg.init_std,
    }


def _gpt2_fields(hf: Mapping[str, Any], where: str) -> dict[str, Any]:
    activation = hf.get("activation_function", "gelu_new")
    if activation not in _GPT2_ACTIVATIONS:
        raise ValueError(f"{where}: activation_function={activation!r} is not supported; allowed: "
                         + " | ".join(_GPT2_ACTIVATIONS) + " (nanoattn's tanh-approximated GELU)")
    for key, value in _GPT2_FIXED.items():
        if hf.get(key, value) != value:
            raise ValueError(f"{where}: {key}={hf[key]!r} has no nanoattn counterpart (only {value})")
    dropouts = {key: hf.get(key, 0.1) for key in _GPT2_DROPOUTS}
    if len(set(dropouts.values())) > 1:
        raise ValueError(f"{where}: {', '.join(f'{k}={v}' for k, v in dropouts.items())} differ: "
                         f"nanoattn has one dropout rate for all three")
    return dict(vocab_size=_required(hf, "vocab_size", where), d_model=_required(hf, "n_embd", where),
                n_layer=_required(hf, "n_layer", where), n_head=_required(hf, "n_head", where),
                d_ff=hf.get("n_inner"), max_seq_len=_required(hf, "n_positions", where), pos="learned",
                norm="layernorm", norm_eps=hf.get("layer_norm_epsilon", 1e-5), mlp="gelu", bias=True,
                tie_embeddings=hf.get("tie_word_embeddings", True), dropout=dropouts["attn_pdrop"],
                init_std=hf.get("initializer_range", 0.02))


def _required(hf: Mapping[str, Any], key: str, where: str) -> int:
    """A size the config must give: a positive integer."""
    if hf.get(key) is None:
        raise ValueError(f"{where}: {key!r} is missing")
    if not is_int(hf[key]) or hf[key] <= 0:
        raise ValueError(f"{where}: {key}={hf[key]!r} is invalid: must be a positive integer")
    return hf[key]


# ----------------------------------------------------------------------------- the two families


@dataclass(frozen=True)
class Family:
    """One transformers format: its names, what it fixes, its config mapping and weight rules."""

    title: str  # for messages
    model_type: str
    architecture: str
    pos: str  # the positional encoding that selects this family on export
    needs: dict[str, Any]  # further ModelConfig fields the format fixes
    prefix: str  # the body's key prefix, absent in some older saves
    to_config: Callable[[ModelConfig], dict[str, Any]]
    from_config: Callable[[Mapping[str, Any], str], dict[str, Any]]
    body_rules: Callable[[ModelConfig], list[Rule]]

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        """Every stored tensor; a tied LM head is the embedding, stored once (as save_pretrained does)."""
        head = [] if cfg.tie_embeddings else [Rule("lm_head.weight", ("lm_head.weight",))]
        return self.body_rules(cfg) + head


FAMILIES = (
    Family("Llama", "llama", "LlamaForCausalLM", "rope", {"norm": "rmsnorm", "mlp": "swiglu"}, "model.",
            _llama_config, _llama_fields, _llama_rules),
    Family("GPT-2", "gpt2", "GPT2LMHeadModel", "learned", {"norm": "layernorm", "mlp": "gelu", "bias": True},
            "transformer.", _gpt2_config, _gpt2_fields, _gpt2_rules),
)


def family_for(cfg: ModelConfig) -> Family:
    """The format ``cfg`` exports as, or a one-line refusal naming the field with no counterpart."""
    for family in FAMILIES:
        if cfg.pos == family.pos:
            for field, want in family.needs.items():
                if getattr(cfg, field) != want:
                    raise ValueError(f"model.{field}={getattr(cfg, field)!r} has no counterpart in "
                                     f"transformers' {family.title} format (pos={cfg.pos!r} exports as "
                                     f"{family.title}, which needs {field}={want!r})")
            return family
    supported = ", ".join(f"pos={f.pos!r} ({f.title})" for f in FAMILIES)
    raise ValueError(f"model.pos={cfg.pos!r} has no transformers counterpart; export supports {supported}")


def read_hf_config(hf: Mapping[str, Any], where: str) -> tuple[Family, ModelConfig]:
    """The family and the equivalent ModelConfig of a parsed config.json, or a clear refusal."""
    model_type = hf.get("model_type")
    family = next((f for f in FAMILIES if f.model_type == model_type), None)
    if family is None:
        supported = ", ".join(f"{f.model_type!r} ({f.architecture})" for f in FAMILIES)
        raise ValueError(f"{where}: model_type={model_type!r} is not supported; import reads {supported}")
    architectures = hf.get("architectures") or [family.architecture]
    if family.architecture not in architectures:
        raise ValueError(f"{where}: architectures={architectures} is not supported: import needs "
                         f"{family.architecture} (a causal LM head)")
    if hf.get("quantization_config"):
        raise ValueError(f"{where}: quantized weights (quantization_config) are not supported")
    try:
        fields = family.from_config(hf, where)
    except TypeError as e:  # arithmetic on a value of the wrong type, e.g. a string where a number goes
        raise ValueError(f"{where}: a value has the wrong type ({e})") from None
    try:
        return family, ModelConfig.from_dict(fields)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
