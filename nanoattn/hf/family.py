"""The machinery every transformers format shares: weight rules, the ``Family`` record, helpers.

Design:
- Weights move through one table of rules per family (``Rule``) that both directions read, so
  export and import cannot disagree. A rule names our tensor, theirs, an optional row order
  (Llama 4 rotates interleaved pairs where we rotate half-split ones: a fixed permutation of
  the q/k rows of each head), an optional row split (our fused QKV rows [q | k | v] and SwiGLU
  rows [gate | up] become separate projections), a transpose (GPT-2's ``Conv1D`` stores
  [in, out], ``nn.Linear`` [out, in]), more of our tensors whose rows join the first's before the
  order and the split (Qwen3-Next's ``q_proj`` interleaves our queries with the output gate's
  rows) and an offset (Qwen3-Next stores each RMSNorm gain as 1 + w: theirs = ours - offset).
- A ``Family`` is one transformers format: its names, which models it takes on export
  (``selects``), the ModelConfig fields it fixes (``needs``), its config mapping both ways and
  its weight rules. The families themselves live in one module each; ``formats`` lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nanoattn.config import ModelConfig
from nanoattn.mechanisms import mechanism_fields
from nanoattn.validation import declared_defaults, is_int


@dataclass(frozen=True)
class Rule:
    """How one of our tensors is stored in transformers' format (both directions read it)."""

    ours: str  # a GPT state_dict key
    theirs: tuple[str, ...]  # the transformers keys it becomes, in row order
    split: tuple[int, ...] | None = None  # rows of ours per key in theirs (fused projections)
    transpose: bool = False  # GPT-2's Conv1D weight is [in, out]
    # Row i of theirs (before the split) is row order[i] of ours; None keeps the order.
    order: tuple[int, ...] | None = None
    also: tuple[str, ...] = ()  # further GPT keys whose rows follow ours' (before order and split)
    offset: float = 0.0  # theirs = ours - offset (a gain stored as 1 + w)


def linear_rules(ours: str, theirs: tuple[str, ...], bias: bool, *, split: tuple[int, ...] | None = None,
                 transpose: bool = False, order: tuple[int, ...] | None = None) -> list[Rule]:
    """The weight (and bias) of one linear layer; Conv1D biases are not transposed."""
    rules = [Rule(f"{ours}.weight", tuple(f"{t}.weight" for t in theirs), split, transpose, order)]
    if bias:
        rules.append(Rule(f"{ours}.bias", tuple(f"{t}.bias" for t in theirs), split, order=order))
    return rules


def interleaved_order(n_head: int, n_kv_head: int, head_dim: int) -> tuple[int, ...]:
    """Fused QKV rows reordered so each q and k head's half-split pairs (i, i + D/2) become the
    interleaved pairs (2i, 2i + 1) that a complex-number RoPE rotates; v rows stay in place.

    Within a head, their row 2i is our row i and their row 2i + 1 is our row D/2 + i: the same
    rotation of the same numbers, and q.k is unchanged because q and k are permuted alike.
    """
    half = head_dim // 2
    within = [i // 2 + (half if i % 2 else 0) for i in range(head_dim)]
    qk = [head * head_dim + j for head in range(n_head + n_kv_head) for j in within]
    return tuple(qk) + tuple(range(len(qk), len(qk) + n_kv_head * head_dim))


def required(hf: Mapping[str, Any], key: str, where: str) -> int:
    """A size the config must give: a positive integer."""
    if hf.get(key) is None:
        raise ValueError(f"{where}: {key!r} is missing")
    if not is_int(hf[key]) or hf[key] <= 0:
        raise ValueError(f"{where}: {key}={hf[key]!r} is invalid: must be a positive integer")
    return hf[key]


# The attention variants outside ``nanoattn.mechanisms`` that most formats cannot compute: every family's
# ``needs`` but where it maps one (Qwen 3: QK-norm before RoPE; Ministral: sliding windows).
PLAIN_ATTENTION = {"attn_sinks": False, "logit_softcap": None,
                   "sliding_window": None, "diff_attn": False, "mla_kv_rank": None, "value_embeds": 0,
                   "token_shift": False, "canon": 0, "attn_fn": "softmax", "forget_gate": False,
                   "selective_attn": False, "abacus": False, "kv_shift": False}


def plain_mechanisms() -> dict[str, Any]:
    """Every registered mechanism's fields at the plain model's values (their declared defaults): what
    a format fixes unless its ``needs`` maps the mechanism (Qwen3-Next: the output gate). Read when
    asked, so a mechanism registered at run time is refused on export too."""
    defaults = declared_defaults(ModelConfig)
    return {field: defaults[field] for field in mechanism_fields()}


def shortest_cycle(values: list[Any]) -> Any:
    """The shortest list that, cycled, gives ``values`` (one value when uniform): how a config writes a
    per-layer field (``pos``, ``sliding_window``)."""
    for period in range(1, len(values) + 1):
        if all(value == values[i % period] for i, value in enumerate(values)):
            return values[0] if period == 1 else values[:period]
    return values  # not reached: the full list is its own cycle


def only_rope(cfg: ModelConfig) -> bool:
    """Every layer rotates with plain RoPE (``pos='rope'``, or a list of 'rope' only)."""
    return set(cfg.layer_pos) == {"rope"}


@dataclass(frozen=True)
class Family:
    """One transformers format: its names, what it fixes, its config mapping and weight rules."""

    title: str  # for messages
    model_type: str
    architecture: str
    exports: str  # the models it takes on export, for messages: "pos='learned'"
    selects: Callable[[ModelConfig], bool]  # True for the models this family exports
    needs: dict[str, Any]  # further ModelConfig fields the format fixes
    prefix: str  # the body's key prefix, absent in some older saves
    to_config: Callable[[ModelConfig], dict[str, Any]]  # may refuse a field in one line
    from_config: Callable[[Mapping[str, Any], str], dict[str, Any]]
    body_rules: Callable[[ModelConfig], list[Rule]]

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        """Every stored tensor; a tied LM head is the embedding, stored once (as save_pretrained does)."""
        head = [] if cfg.tie_embeddings else [Rule("lm_head.weight", ("lm_head.weight",))]
        return self.body_rules(cfg) + head

    def refuse(self, field: str, value: Any, why: str) -> ValueError:
        """The one-line export refusal of a field this format cannot represent."""
        return ValueError(f"model.{field}={value!r} has no counterpart in transformers' {self.title} format "
                          f"({self.exports} exports as {self.title}, {why})")
