"""The model's schema: ``ModelConfig`` (the named presets are ``presets.py``).

Every field is validated in ``__post_init__`` with a one-line ``ValueError`` naming the field,
the bad value and what is allowed: its type (a number is an int or a float, never a bool or a
string, and finite) and its range, whether or not the model uses the field. The positional
registry is imported (it sits below this layer) so that ``pos`` is checked against the encodings
that exist, and a RoPE scaling is normalised by the same pure function the model uses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nanoattn.config.per_layer import cycled, per_layer
from nanoattn.config.variants import check_attention_variants
from nanoattn.mechanisms import REGISTRY as MECHANISMS
from nanoattn.mechanisms import used_mechanisms
from nanoattn.mechanisms.score_functions import SCORE_FUNCTIONS
from nanoattn.positional import REGISTRY, encodings_with
from nanoattn.positional.rope_scaling import normalize_rope_scaling, rope_depends_on_length
from nanoattn.validation import (
    check_bool,
    check_choice,
    check_number,
    check_positive_int,
    fail,
    from_dict,
)

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu", "relu2")
ATTN_KERNELS = ("auto", "sdpa")
# Fields read only by the encodings that use them; checked here for their type whatever the model's
# pos, and by the encoding's ``check_config`` for its own rules when the model uses it.
ENCODING_INTS = ("t5_num_buckets", "t5_max_distance", "fire_mlp_width", "cope_npos_max")


@dataclass
class ModelConfig:
    """A decoder-only GPT. Defaults give a small LLaMA-style model that trains on a CPU."""

    vocab_size: int = 2048
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None  # None = n_head (MHA); a divisor of n_head (GQA); 1 (MQA)
    d_ff: int | None = None  # None = 4*d_model (gelu) or 8/3*d_model rounded up to ffn_multiple_of (swiglu)
    ffn_multiple_of: int = 256  # LLaMA's rounding of the SwiGLU width
    max_seq_len: int = 256  # training context; the learned table's size
    # An encoding's name (positional.REGISTRY), or a list of names cycled over the layers:
    # [rope, rope, rope, nope] is Llama 4's iRoPE. Embedding-level ones only as a single name.
    pos: Any = "rope"
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None or {"type": ..., "factor": ..., ...}
    rope_fraction: float = 1.0  # partial RoPE: fraction of each head's dims rotated (NeoX's rotary_pct)
    rope_p: float = 1.0  # p-RoPE (Barbero et al. 2024): fraction of frequencies kept, lowest dropped
    xpos_scale_base: float = 512.0  # xPos: gamma in the decay zeta ** (n / gamma)
    t5_num_buckets: int = 32  # T5 bias: log-spaced distance buckets
    t5_max_distance: int = 128  # T5 bias: distances past this share the last bucket
    fire_mlp_width: int = 32  # FIRE: hidden width of the bias MLP
    cope_npos_max: int = 64  # CoPE: contextual positions are clipped below this
    pope_phase_bias: bool = True  # PoPE: a learned phase bias per layer, head and frequency (from 0)
    # Abacus embeddings (McLeish et al. 2024, model/abacus.py): a learned vector for each digit's index
    # within its number added to its token embedding, beside any pos (pos options abacus, abacus_fire...).
    abacus: bool = False
    abacus_max_offset: int = 100  # training shifts the digits' indices by one k uniform in [0, this]
    abacus_digits: list[int] | None = None  # token ids of '0'..'9'; None: the trainer reads the tokenizer's
    # Llama 4's query temperature on NoPE layers: None = off; else floor_scale (Llama 4: 8192).
    temperature_floor_scale: int | None = None
    temperature_attn_scale: float = 0.1  # Llama 4's attn_scale
    # RMSNorm of each query and key head: before the rotation (OLMo 2, Qwen 3) or after it (nanochat).
    qk_norm: str = "none"  # none | before_rope | after_rope
    # Sliding-window attention: None (every earlier token), a window W (each query sees itself and the
    # W - 1 tokens before it, as Mistral), or a list cycled over the layers ([64, 64, 64, null]).
    sliding_window: Any = None
    attn_sinks: bool = False  # gpt-oss: a learned logit per head that takes softmax mass and no value
    # What turns scores into weights: softmax | stick_breaking (Tan et al. 2025: each earlier key takes
    # sigma(s) of the stick the nearer keys left; no position needed) | sigmoid (Ramapuram et al. 2024:
    # sigma(s - log max_seq_len) per key, unnormalised).
    attn_fn: str = "softmax"
    # FoX (Lin et al. 2025): per head a forget gate f_t = sigma(w.x_t + b) of each token; key j's score for
    # query i gets sum_{t=j+1..i} log f_t. Needs no position (pos=nope is the paper's setting).
    forget_gate: bool = False
    # Differential attention (Ye et al. 2024): query/key heads pair up, each pair's two softmax maps
    # are subtracted; n_head / 2 heads with values of 2 * head_dim. Needs even n_head and n_kv_head.
    diff_attn: bool = False
    # Multi-head latent attention (DeepSeek-V2): None = the fused-QKV attention; else the rank of the
    # joint key/value latent, which the KV cache holds with one shared rotary key of mla_rope_dim.
    mla_kv_rank: int | None = None
    mla_q_rank: int | None = None  # low-rank queries through this rank (DeepSeek's q_lora_rank); None: full
    mla_rope_dim: int = 16  # decoupled RoPE: rotary dims per query head and of the shared key
    attn_softcap: float | None = None  # Gemma 2: scores q.k/sqrt(d) -> cap * tanh(scores / cap) (50.0)
    logit_softcap: float | None = None  # Gemma 2: output logits -> cap * tanh(logits / cap) (30.0)
    value_embeds: int = 0  # modded-nanogpt: token tables mixed into the values of the first and last layers
    # Token shift (RWKV, modded-nanogpt's smear): each token's embedding plus a learned per-channel gate
    # (from 0) times its predecessor's, so the first layer sees the previous token without attention.
    token_shift: bool = False
    # Gated attention (Qiu et al. 2025, G1; Qwen3-Next): sigmoid(x W_g) multiplies each head's output
    # before W_O, one gate per head (headwise) or per channel (elementwise); x the attention's input.
    attn_gate: str = "none"  # none | headwise | elementwise
    # Scalable-Softmax (Nakanishi 2025): logits times s_h log n, n the keys a query sees, s_h learned.
    ssmax: bool = False
    # Exclusive self-attention (Zhai 2026): each output minus its projection on the token's own value.
    xsa: bool = False
    # Talking-heads attention (Shazeer et al. 2020): learned mixes of the heads' logits and of their weights.
    talking_heads: bool = False
    # FoX Pro (Lin et al. 2025): RMSNorm of each head's output (a gain per channel) before the output gate.
    attn_output_norm: bool = False
    # FoX Pro's key/value shift: k_t = a_t k_{t-1} + (1 - a_t) k_t over the raw projections, a = sigma(x w)
    # per K/V head and token, values alike with their own a; the cache keeps the newest raw key and value.
    kv_shift: bool = False
    # Canon layers (Allen-Zhu 2025, Canon-A): 0 = off; else the width of a causal depthwise convolution,
    # with a residual, of every attention block's normalised input (token shift: width 2, on the embeddings).
    canon: int = 0
    # Selective attention (Leviathan et al. 2024): head 0's positive logits, summed over the earlier
    # queries (F), are subtracted from every head's logits, so a token can mask earlier ones for all later
    # queries; the KV cache keeps F's column sums. Not with sliding_window or diff_attn.
    selective_attn: bool = False
    # How attention is computed, the same function either way: auto (on CPU in bf16 with up to 1,024
    # keys, two bf16 matmuls and a softmax where timed faster on the machine; else SDPA) | sdpa (SDPA
    # wherever it can compute it).
    attn_kernel: str = "auto"
    norm: str = "rmsnorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5
    mlp: str = "swiglu"  # gelu | swiglu | relu2 (two matrices, ReLU squared: Primer, modded-nanogpt)
    bias: bool = False  # biases in every linear layer and LayerNorm
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        own = "model"
        for name in ("vocab_size", "d_model", "n_layer", "n_head", "max_seq_len", "ffn_multiple_of"):
            check_positive_int(own, name, getattr(self, name))
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        check_positive_int(own, "n_kv_head", self.n_kv_head)
        if self.n_head % self.n_kv_head:
            fail(own, "n_kv_head", self.n_kv_head,
                  f"must divide n_head={self.n_head} (MHA: n_kv_head=n_head, MQA: 1)")
        if self.d_model % self.n_head:
            fail(own, "d_model", self.d_model, f"must be divisible by n_head={self.n_head}")
        self._check_pos()
        check_choice(own, "norm", self.norm, NORMS)
        for name in ("attn_sinks", "forget_gate", "token_shift", "selective_attn", "pope_phase_bias", "bias",
                     "tie_embeddings"):
            check_bool(own, name, getattr(self, name))
        check_choice(own, "attn_kernel", self.attn_kernel, ATTN_KERNELS)
        check_choice(own, "attn_fn", self.attn_fn, tuple(SCORE_FUNCTIONS))
        if self.attn_sinks and self.attn_fn != "softmax":
            fail(own, "attn_fn", self.attn_fn, "cannot be combined with attn_sinks=True: a sink is one more "
                 "column of a softmax, and this function normalises nothing over the keys")
        for mechanism in MECHANISMS.values():
            mechanism.check_config(self)
        check_attention_variants(self)
        if self.logit_softcap is not None:
            check_number(own, "logit_softcap", self.logit_softcap, "must be a positive finite number or null "
                         "(no capping)")
            self.logit_softcap = float(self.logit_softcap)
        check_choice(own, "mlp", self.mlp, MLPS)
        if self.d_ff is not None:
            check_positive_int(own, "d_ff", self.d_ff)
        for name in ("rope_theta", "norm_eps", "init_std"):
            check_number(own, name, getattr(self, name))
        check_number(own, "dropout", self.dropout, "must be in [0, 1)", lambda x: 0 <= x < 1)
        if self.temperature_floor_scale is not None:
            check_positive_int(own, "temperature_floor_scale", self.temperature_floor_scale)
        check_number(own, "temperature_attn_scale", self.temperature_attn_scale,
                     "must be a finite number >= 0", lambda x: x >= 0)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Mapping):
            fail(own, "rope_scaling", self.rope_scaling, "must be null or a mapping such as "
                 "{type: linear, factor: 2.0}")
        for name in self.encodings:
            REGISTRY[name].check_config(self)
        # After the encodings' own checks, whose messages say more for the encodings the model uses.
        for name in ENCODING_INTS:
            check_positive_int(own, name, getattr(self, name))
        for name in ("rope_fraction", "rope_p"):
            check_number(own, name, getattr(self, name), "must be in (0, 1]", lambda x: 0 < x <= 1)
        check_number(own, "xpos_scale_base", self.xpos_scale_base)
        if self.rope_scaling is not None:
            if not self.rotary:
                fail(own, "rope_scaling", dict(self.rope_scaling),
                      f"only applies to rotary encodings ({' | '.join(encodings_with('rotary'))}), this "
                      f"model has pos={self.pos!r}")
            self.rope_scaling = normalize_rope_scaling(self.rope_scaling, self.max_seq_len)

    def _check_pos(self) -> None:
        names = tuple(REGISTRY)
        if isinstance(self.pos, str):
            check_choice("model", "pos", self.pos, names)
            return
        if not isinstance(self.pos, Sequence) or not 1 <= len(self.pos) <= self.n_layer:
            fail("model", "pos", self.pos, f"must be an encoding name or a list of 1 to "
                 f"n_layer={self.n_layer} names cycled over the layers; names: {' | '.join(names)}")
        self.pos = list(self.pos)  # a plain list (Hydra hands a ListConfig), as config.json stores it
        for name in self.pos:
            check_choice("model", "pos", name, names)
            if REGISTRY[name].acts_on_embeddings:
                fail("model", "pos", self.pos, f"{name!r} adds positions to the embeddings, before any "
                     f"layer: it can only be the whole model's choice (pos={name})")

    @property
    def layer_value_embed(self) -> tuple[int | None, ...]:
        """Each layer's value-embedding table (None: none): table i feeds layer i and layer
        n_layer - value_embeds + i, the U shape of modded-nanogpt."""
        tables: list[int | None] = [None] * self.n_layer
        for table in range(self.value_embeds):
            tables[table] = tables[self.n_layer - self.value_embeds + table] = table
        return tuple(tables)

    @property
    def attention_heads(self) -> int:
        """The heads each layer's attention has as seen from outside (head_mask, maps, analysis):
        n_head, or the n_head / 2 pairs of differential attention."""
        return self.n_head // 2 if self.diff_attn else self.n_head

    @property
    def layer_window(self) -> tuple[int | None, ...]:
        """Each layer's attention window (None: global): ``sliding_window`` repeated or cycled."""
        return per_layer(self.sliding_window, self.n_layer)

    @property
    def encodings(self) -> tuple[str, ...]:
        """The encodings the layers use, each once, in order (``layer_pos`` without the repeats;
        validation reads this, so a config of 10**8 layers costs no more to check than one of 4)."""
        return tuple(dict.fromkeys(cycled(self.pos)))

    @property
    def layer_pos(self) -> tuple[str, ...]:
        """The encoding of each layer: ``pos`` repeated, or its list cycled over the layers."""
        return per_layer(self.pos, self.n_layer)

    @property
    def rotary(self) -> bool:
        """Whether some layer's encoding rotates q and k (``PositionalEncoding.rotary``: RoPE, xPos,
        alone or in a per-layer layout such as iRoPE): the models a RoPE scaling applies to, by config,
        zero-shot or by context extension."""
        return any(REGISTRY[name].rotary for name in self.encodings)

    @property
    def length_limit(self) -> int | None:
        """The longest input the model is defined at: ``max_seq_len`` when an encoding has a learned
        length (``PositionalEncoding.learned_length``: no value past its table), else None (any)."""
        return self.max_seq_len if any(REGISTRY[name].learned_length for name in self.encodings) else None

    @property
    def positions_refusal(self) -> str | None:
        """Why this model refuses given per-token positions, in words; None when it takes them: every
        encoding it uses reads its positions (``takes_positions``), no mechanism it uses refuses them
        (``Mechanism.given_positions_refusal``), and no rotation depends on the sequence length, which
        given positions do not fix."""
        refusing = [name for name in self.encodings if not REGISTRY[name].takes_positions]
        if refusing:
            return (f"pos={self.pos!r} has no use for them ({' and '.join(refusing)} reads no position); the "
                    f"encodings that take them: {' | '.join(encodings_with('takes_positions'))}")
        for mechanism in used_mechanisms(self).values():
            if mechanism.given_positions_refusal is not None:
                field = mechanism.fields[0]
                return f"model.{field}={getattr(self, field)!r} {mechanism.given_positions_refusal}"
        # FoX's decay counts a query's keys by the default positions (model/forget_gate.py).
        if self.forget_gate:
            return "model.forget_gate=True counts each query's keys by its default position, 0..T-1"
        if self.rotary and rope_depends_on_length(self.rope_scaling):
            return (f"rope_scaling type {self.rope_scaling['type']!r} rotates by the sequence length, which "
                    "given positions do not fix")
        return None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.mlp != "swiglu":  # two matrices: GPT-2's 4x width
            return 4 * self.d_model
        hidden = int(2 * 4 * self.d_model / 3)
        return self.ffn_multiple_of * math.ceil(hidden / self.ffn_multiple_of)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        return from_dict(cls, values, owner="model")


