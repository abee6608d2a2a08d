"""The checks of the attention variants that are ``ModelConfig`` fields of their own and not yet modules
of ``nanoattn.mechanisms`` (which check their fields themselves): differential and latent attention,
windows, selective attention, value embeddings, Abacus, the key/value shift and canon layers.

``check_attention_variants`` runs them in ``ModelConfig.__post_init__``, after the mechanisms' own
checks, each with a one-line ``ValueError`` naming the field, the bad value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Sequence

from nanoattn.config.per_layer import cycled
from nanoattn.mechanisms import used_mechanisms
from nanoattn.positional import REGISTRY
from nanoattn.validation import (
    check_bool,
    check_non_negative_int,
    check_positive_int,
    declared_defaults,
    fail,
    is_int,
)


def check_attention_variants(cfg) -> None:
    """Every check below, in this order, on ``cfg`` (a ModelConfig)."""
    for check in (check_diff_attn, check_mla, check_sliding_window, check_selective_attn, check_value_embeds,
                  check_abacus, check_shift_and_canon, check_rotated_heads):
        check(cfg)


def check_rotated_heads(cfg) -> None:
    """A mechanism acting on the rotated heads takes head_dim numbers a head: refused beside an encoding
    whose map makes them wider (PoPE's polar form: ``PositionalEncoding.key_width``)."""
    widened = [name for name in cfg.encodings if REGISTRY[name].key_width(cfg.head_dim) != cfg.head_dim]
    if not widened:
        return
    width = REGISTRY[widened[0]].key_width(cfg.head_dim)
    for mechanism in used_mechanisms(cfg).values():
        if mechanism.acts_after_rotation(cfg):
            field = mechanism.fields[0]
            fail("model", field, getattr(cfg, field),
                 f"cannot act after the rotation with pos={cfg.pos!r}: after {widened[0]}'s map a head is "
                 f"{width} numbers, where it takes head_dim={cfg.head_dim}")


def check_diff_attn(cfg) -> None:
    check_bool("model", "diff_attn", cfg.diff_attn)
    if not cfg.diff_attn:
        return
    for name in ("n_head", "n_kv_head"):
        if getattr(cfg, name) % 2:
            fail("model", name, getattr(cfg, name), "must be even with diff_attn=True: differential "
                 "attention pairs query heads and key/value heads")
    if cfg.attn_sinks:
        fail("model", "attn_sinks", cfg.attn_sinks, "cannot be combined with diff_attn=True: a sink "
             "would join each of the two maps a head subtracts, which neither paper describes")
    if cfg.attn_fn != "softmax":
        fail("model", "attn_fn", cfg.attn_fn, "cannot be combined with diff_attn=True: differential "
             "attention subtracts two softmax maps")
    if cfg.forget_gate:
        fail("model", "forget_gate", cfg.forget_gate, "cannot be combined with diff_attn=True: a gate "
             "per query head would decay the two maps a head subtracts, which neither paper describes")
    biased = [name for name in cfg.encodings if REGISTRY[name].adds_bias]
    if biased:
        fail("model", "diff_attn", cfg.diff_attn, f"needs encodings without an attention bias (the "
             f"paper's maps are plain softmaxes); pos={cfg.pos!r} adds {' and '.join(biased)}")
    for mechanism in used_mechanisms(cfg).values():
        if mechanism.paired_heads_refusal is not None:
            field = mechanism.fields[0]
            fail("model", field, getattr(cfg, field), "cannot be combined with diff_attn=True: "
                 f"{mechanism.paired_heads_refusal}")


def check_mla(cfg) -> None:
    check_positive_int("model", "mla_rope_dim", cfg.mla_rope_dim)
    if cfg.mla_q_rank is not None:
        check_positive_int("model", "mla_q_rank", cfg.mla_q_rank)
    if cfg.mla_kv_rank is None:
        if cfg.mla_q_rank is not None:
            fail("model", "mla_q_rank", cfg.mla_q_rank, "needs mla_kv_rank: low-rank queries are part "
                 "of multi-head latent attention")
        return
    check_positive_int("model", "mla_kv_rank", cfg.mla_kv_rank)
    if cfg.mla_rope_dim % 2:
        fail("model", "mla_rope_dim", cfg.mla_rope_dim, "must be even: RoPE rotates pairs")
    why = "with mla_kv_rank (multi-head latent attention: decoupled RoPE, MHA over the latent)"
    fixed = (("pos", cfg.pos, "rope"), ("n_kv_head", cfg.n_kv_head, cfg.n_head),
             ("rope_scaling", cfg.rope_scaling, None), ("rope_fraction", cfg.rope_fraction, 1.0),
             ("rope_p", cfg.rope_p, 1.0), ("diff_attn", cfg.diff_attn, False))
    for name, value, want in fixed:
        if value != want:
            fail("model", name, value, f"must be {want!r} {why}")
    plain = declared_defaults(type(cfg))
    for mechanism in used_mechanisms(cfg).values():
        if mechanism.acts_on_projections():  # latent attention makes its keys from the latent
            field = mechanism.fields[0]
            fail("model", field, getattr(cfg, field), f"must be {plain[field]!r} {why}")


def check_selective_attn(cfg) -> None:
    if not cfg.selective_attn:
        return
    if cfg.sliding_window is not None:
        fail("model", "selective_attn", cfg.selective_attn, f"cannot be combined with sliding_window="
             f"{cfg.sliding_window!r}: the paper's F sums over every earlier query of a global layer, "
             "and a window already drops the keys selective attention would prune")
    if cfg.diff_attn:
        fail("model", "selective_attn", cfg.selective_attn, "cannot be combined with diff_attn=True: "
             "the paper selects with one softmax head's logits, and a differential head has two maps")
    for mechanism in used_mechanisms(cfg).values():
        if mechanism.mixes_heads:
            field = mechanism.fields[0]
            fail("model", field, getattr(cfg, field), "cannot be combined with selective_attn=True: "
                 "selective attention selects with head 0's own scores, and this mixes every head's scores")


def check_value_embeds(cfg) -> None:
    if not (is_int(cfg.value_embeds) and 0 <= 2 * cfg.value_embeds <= cfg.n_layer):
        fail("model", "value_embeds", cfg.value_embeds, f"must be an integer from 0 to n_layer / 2 = "
             f"{cfg.n_layer // 2}: table i feeds layer i and layer n_layer - value_embeds + i")
    if cfg.value_embeds and cfg.mla_kv_rank is not None:
        fail("model", "value_embeds", cfg.value_embeds, "must be 0 with mla_kv_rank (latent attention's "
             "values come from its cached latent)")


def check_abacus(cfg) -> None:
    check_bool("model", "abacus", cfg.abacus)
    check_non_negative_int("model", "abacus_max_offset", cfg.abacus_max_offset)
    digits = cfg.abacus_digits
    if digits is None:
        return
    valid = not isinstance(digits, str) and isinstance(digits, Sequence) and len(digits) == 10
    if not (valid and len(set(digits)) == 10 and all(is_int(t) and 0 <= t < cfg.vocab_size
                                                    for t in digits)):
        fail("model", "abacus_digits", digits, "must be null or the 10 distinct token ids of the digits "
             f"0-9, each below vocab_size={cfg.vocab_size}")
    cfg.abacus_digits = list(digits)  # a plain list (Hydra hands a ListConfig), as config.json stores it


def check_shift_and_canon(cfg) -> None:
    """The key/value shift and canon layers (``model/gates.py``); the mechanisms' own fields are
    checked by their modules (``nanoattn.mechanisms``)."""
    check_bool("model", "kv_shift", cfg.kv_shift)
    if cfg.kv_shift and cfg.mla_kv_rank is not None:
        fail("model", "kv_shift", True, f"cannot be combined with mla_kv_rank={cfg.mla_kv_rank}: it "
             "shifts each head's own key and value projections; latent attention's come from a latent")
    if not (is_int(cfg.canon) and cfg.canon != 1 and 0 <= cfg.canon <= cfg.max_seq_len):
        fail("model", "canon", cfg.canon, "must be 0 (off) or a convolution width from 2 (the token and "
             f"width - 1 before it) to max_seq_len={cfg.max_seq_len}: a wider one's taps never see a "
             "token in training")


def check_sliding_window(cfg) -> None:
    windows = cfg.sliding_window
    if isinstance(windows, Sequence) and not isinstance(windows, (str, bytes)):
        if not 1 <= len(windows) <= cfg.n_layer:
            fail("model", "sliding_window", windows, f"must be null, a window or a list of 1 to "
                 f"n_layer={cfg.n_layer} windows (null: a global layer) cycled over the layers")
        cfg.sliding_window = windows = list(windows)  # a plain list (Hydra hands a ListConfig)
    for window in cycled(windows):
        if window is not None and not (is_int(window) and window > 0):
            fail("model", "sliding_window", cfg.sliding_window, "each window must be a positive "
                 "integer (tokens a query sees, itself included) or null (every earlier token)")
    if all(window is None for window in cycled(windows)):
        cfg.sliding_window = None  # [null, null] is the plain model: one spelling of it
