"""Head analysis: what each attention head attends to, how much the model needs it, and pruning.

Design choices:

- Attention weights come only from the model's slow path (``GPT.attention_maps``); the fast SDPA
  path never materialises them. Tests check that both paths give the same logits.
- Statistics average over queries ``FIRST_QUERY``.. of every validation window. From query 2 on,
  the first, the previous and the current token are three distinct keys, so their masses never
  double count and at most one of them can pass the 0.5 that names a head after it.
- "First token" is the first token of the window. Training windows also start at arbitrary
  offsets, so a head that parks its attention there is an attention sink (Xiao et al. 2023,
  arXiv:2309.17453), not a beginning-of-document detector.
- Delimiters are decided from the tokenizer's own decoded strings (any tokenizer, no word list):
  a token is one when it decodes to punctuation and whitespace only, with at least one
  punctuation mark or newline (",", ".\\n", "\\n\\n", " ;"). Special tokens such as
  ``<|endoftext|>``, the document boundary, count too.
- A head's ``kind`` is a fixed rule over its statistics (``classify_head``, thresholds below).
- Importance is the validation loss increase when one head alone is masked (``head_mask``
  multiplies head outputs), or the proxy of Michel et al. 2019 (arXiv:1905.10650),
  |dL/d mask_h| at mask = 1 averaged over batches: one backward pass per batch instead of one
  evaluation per head. Pruning ranks heads once by that importance (no re-estimation after each
  removal) and masks the k lowest, over all heads ("global") or the same number in every layer.
- In GQA/MQA a mask removes one query head's output; the K/V head it shares keeps serving the
  other query heads of its group.
- Score functions other than softmax (``attn_fn``) give weights that need not sum to 1:
  ``weight_sum`` is sigmoid attention's row sum and ``sink_mass`` what no key got, stick-breaking's
  stick left over. FoX's forget gates (``forget_gate``) are read off each gate's output during the
  same pass (a forward hook): ``forget_span`` counts the keys the decay leaves above 1/e.
- This module measures a model on batches; what a variant's own pieces do (gates, selection) is
  ``variant_heads.py``, the figures are ``plots.py``, and loading a run, choosing its windows and
  writing heads.json is ``nanoattn.commands.analyze_heads``.
"""

from __future__ import annotations

import operator
import unicodedata
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from nanoattn.eval.tables import format_table
from nanoattn.model import GPT
from nanoattn.validation import check_choice, check_positive_int, fail

# The first query the statistics average over; queries 0 and 1 see fewer than three distinct keys.
FIRST_QUERY = 2
# A head is named after the first token, the previous token or itself when that key gets at least
# this share of a query's attention on average: a majority, so at most one of the three can pass.
POSITIONAL_MASS = 0.5
# ... after delimiters when they get a majority: well above their share of the keys, which near-uniform
# heads put at 0.22 on Shakespeare with the default BPE (docs/heads.md).
DELIMITER_MASS = 0.5
# "local": the attended keys are on average at most this many tokens back (windows are far longer).
LOCAL_MAX_OFFSET = 4.0
# "broad": entropy / ln(keys the query sees) at least this; 1 is uniform over the whole prefix.
BROAD_MIN_ENTROPY = 0.6
KINDS = ("first_token", "previous_token", "current_token", "delimiter", "local", "broad", "mixed")
PRUNE_SCOPES = ("global", "layer")
STATISTICS = ("entropy", "normalized_entropy", "mean_offset", "prev_token_mass", "first_token_mass",
              "current_token_mass", "delimiter_mass", "sink_mass", "weight_sum", "forget_span")
# forget_span: a key still holds e^-1 of its weight at this decay, sum of log f from it to the query.
SPAN_DECAY = -1.0

Batch = tuple[torch.Tensor, torch.Tensor]  # (x, y), each int64 [B, T]


# ---------------------------------------------------------------------------------------------------------
# Masks, losses, maps


def prune_heads(model: GPT, heads: Iterable[Sequence[int]]) -> torch.Tensor:
    """A ``head_mask`` [n_layer, attention_heads] of ones with zeros at the given (layer, head) pairs.

    Pass it to ``model(idx, head_mask=...)``, ``model.loss`` or ``model.hidden_states``.
    """
    cfg = model.cfg
    mask = torch.ones(cfg.n_layer, cfg.attention_heads, device=model.tok_emb.weight.device)
    for pair in heads:
        mask[check_head(model, pair)] = 0.0
    return mask


def check_head(model: GPT, pair: Sequence[int], owner: str | None = None) -> tuple[int, int]:
    """(layer, head) as ints, or a ValueError naming the pair (``owner.head``) and the model's ranges;
    a differential model's heads are its n_head / 2 pairs."""
    cfg = model.cfg
    try:
        layer, head = (operator.index(v) for v in pair)
    except (TypeError, ValueError):
        layer = head = -1
    if not (0 <= layer < cfg.n_layer and 0 <= head < cfg.attention_heads):
        pairs = f" (differential attention: pairs of its {cfg.n_head} query heads)" if cfg.diff_attn else ""
        raise ValueError(f"{owner + '.' if owner else ''}head={pair!r} is invalid: expected "
                         f"[layer, head] with 0 <= layer < {cfg.n_layer} and "
                         f"0 <= head < {cfg.attention_heads}{pairs}")
    return layer, head


@torch.no_grad()
def mean_loss(model: GPT, batches: Sequence[Batch], head_mask: torch.Tensor | None = None) -> float:
    """Mean next-token loss in nats over every target of ``batches``."""
    check_batches(batches)
    total, count = 0.0, 0
    for x, y in batches:
        total += float(model.loss(x, y, reduction="sum", head_mask=head_mask))
        count += y.numel()
    return total / count


@torch.no_grad()
def attention_maps(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """idx [B, T] -> attention weights [B, n_layer, n_head, T, T] (query, key), from the slow path."""
    _, weights = model.attention_maps(idx)
    return torch.stack(weights, dim=1)


# ---------------------------------------------------------------------------------------------------------
# Statistics and kinds


def delimiter_ids(tokenizer) -> list[int]:
    """Ids whose decoded string is punctuation/newlines (and spaces) only, plus special tokens."""
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    ids = range(tokenizer.get_vocab_size())
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return [i for i, text in zip(ids, texts, strict=True) if i in special or _is_delimiter(text)]


def _is_delimiter(text: str) -> bool:
    marks = [c for c in text if c == "\n" or not c.isspace()]
    return bool(marks) and all(c == "\n" or unicodedata.category(c).startswith("P") for c in marks)


def query_statistics(weights: torch.Tensor, is_delimiter: torch.Tensor,
                     forget_gates: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Per-query statistics of one layer's weights [B, H, T, T] -> each [B, H, T - FIRST_QUERY].

    ``is_delimiter`` [B, T] marks the delimiter keys; ``forget_gates`` [B, H, T], the cumulative log
    forget gates c of a FoX layer (None: no gates). Entropy is in nats.
    """
    T = weights.shape[-1]
    if T <= FIRST_QUERY:
        raise ValueError(f"seq_len={T} is too short for head statistics: must be above {FIRST_QUERY}")
    i = torch.arange(T, device=weights.device)
    offset = (i[:, None] - i[None, :]).clamp(min=0).to(weights.dtype)  # [T, T]: query - key, 0 above
    # [B, H, T]; masked keys weigh exactly 0. A differential map has negative entries: the entropy
    # is that of its positive part.
    positive = weights.clamp(min=0)
    entropy = -torch.special.xlogy(positive, positive).sum(-1)
    q = slice(FIRST_QUERY, None)
    weight_sum = weights.sum(-1)
    if forget_gates is None:  # no decay: every key the query sees
        span = (i + 1.0).to(weights.dtype).expand(weight_sum.shape)
    else:  # the keys j <= i with c_i - c_j >= SPAN_DECAY: a run of the latest, since log f <= 0
        decay = forget_gates[..., :, None] - forget_gates[..., None, :]  # [B, H, T, T]
        span = ((decay >= SPAN_DECAY) & (i[None, :] <= i[:, None])).sum(-1).to(weights.dtype)
    return {
        "entropy": entropy[..., q],
        "normalized_entropy": entropy[..., q] / torch.log(i[q] + 1.0),  # query i sees i + 1 keys
        "mean_offset": (weights * offset).sum(-1)[..., q],
        "prev_token_mass": torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1)[..., FIRST_QUERY - 1:],
        "first_token_mass": weights[..., q, 0],
        "current_token_mass": torch.diagonal(weights, dim1=-2, dim2=-1)[..., q],
        "delimiter_mass": (weights * is_delimiter[:, None, None, :]).sum(-1)[..., q],
        # The mass no key got: what a learned sink took (attn_sinks) or the stick stick-breaking left
        # (attn_fn=stick_breaking). 0 for softmax.
        "sink_mass": (1 - weight_sum).clamp(min=0)[..., q],
        # sum_j a_ij: 1 for softmax; sigmoid attention's (attn_fn=sigmoid) is bound by nothing but i + 1.
        "weight_sum": weight_sum[..., q],
        # FoX (forget_gate): how many of the latest keys, the query's own included, keep at least e^-1 of
        # their weight through the gates; i + 1 without gates.
        "forget_span": span[..., q],
    }


def classify_head(stats: Mapping[str, float]) -> str:
    """A head's kind from its statistics; the first rule that matches wins (thresholds above)."""
    for kind, mass in (("sink", "sink_mass"), ("first_token", "first_token_mass"),
                       ("previous_token", "prev_token_mass"), ("current_token", "current_token_mass")):
        if stats[mass] >= POSITIONAL_MASS:
            return kind
    if stats["delimiter_mass"] >= DELIMITER_MASS:
        return "delimiter"
    if stats["mean_offset"] <= LOCAL_MAX_OFFSET:
        return "local"
    if stats["normalized_entropy"] >= BROAD_MIN_ENTROPY:
        return "broad"
    return "mixed"


@torch.no_grad()
def head_statistics(model: GPT, batches: Sequence[Batch], delimiters: Iterable[int] = ()) -> list[dict]:
    """One record per head, layer-major: layer, head, kv_group, kind and the mean ``STATISTICS``."""
    check_batches(batches)
    cfg = model.cfg
    sums = torch.zeros(len(STATISTICS), cfg.n_layer, cfg.attention_heads, dtype=torch.float64)
    delimiter_set = torch.tensor(sorted(set(delimiters)), dtype=torch.int64)
    queries = 0
    with recorded_forget_gates(model) as gates:
        for x, _ in batches:
            is_delimiter = torch.isin(x, delimiter_set.to(x.device))  # [B, T]
            _, weights = model.attention_maps(x)
            for layer, w in enumerate(weights):
                stats = query_statistics(w, is_delimiter, gates.get(layer))
                sums[:, layer] += torch.stack([stats[name].sum(dim=(0, 2))
                                               for name in STATISTICS]).double().cpu()
            queries += x.shape[0] * (x.shape[1] - FIRST_QUERY)
    means = sums / queries  # [n_stats, n_layer, n_head]
    group = cfg.n_head // cfg.n_kv_head  # query heads per K/V head; pairs per pair with diff_attn
    records = []
    for layer in range(cfg.n_layer):
        for head in range(cfg.attention_heads):
            stats = {name: float(means[k, layer, head]) for k, name in enumerate(STATISTICS)}
            records.append({"layer": layer, "head": head, "kv_group": head // group,
                            "kind": classify_head(stats), **stats})
    return records


@contextmanager
def recorded_forget_gates(model: GPT) -> Iterator[dict[int, torch.Tensor]]:
    """Within it, each forward pass of ``model`` records the cumulative log forget gates [B, n_head, T]
    of every FoX layer, by layer index, as the gate hands them to attention."""
    gates: dict[int, torch.Tensor] = {}
    handles = [block.attn.forget_gate.register_forward_hook(
        lambda module, args, decay, layer=layer: gates.__setitem__(layer, decay.cumulative))
        for layer, block in enumerate(model.blocks) if block.attn.forget_gate is not None]
    try:
        yield gates
    finally:
        for handle in handles:
            handle.remove()


# ---------------------------------------------------------------------------------------------------------
# Importance and pruning


def ablation_importance(model: GPT, batches: Sequence[Batch]) -> torch.Tensor:
    """Validation loss increase (nats/token) when each head alone is masked: [n_layer, n_head]."""
    cfg = model.cfg
    base = mean_loss(model, batches)
    importance = torch.zeros(cfg.n_layer, cfg.attention_heads, dtype=torch.float64)
    for layer in range(cfg.n_layer):
        for head in range(cfg.attention_heads):
            importance[layer, head] = mean_loss(model, batches, prune_heads(model, [(layer, head)])) - base
    return importance


def gradient_importance(model: GPT, batches: Sequence[Batch]) -> torch.Tensor:
    """Michel et al. 2019's proxy |dL/d head_mask| at head_mask = 1, averaged over batches."""
    check_batches(batches)
    total = torch.zeros(model.cfg.n_layer, model.cfg.attention_heads, dtype=torch.float64)
    with torch.enable_grad():
        for x, y in batches:
            mask = prune_heads(model, []).requires_grad_()
            # Gradient for the mask only: autograd skips every weight gradient.
            (grad,) = torch.autograd.grad(model.loss(x, y, head_mask=mask), mask)
            total += grad.abs().double().cpu()
    return total / len(batches)


IMPORTANCE: dict[str, Callable[[GPT, Sequence[Batch]], torch.Tensor]] = {
    "ablation": ablation_importance,
    "gradient": gradient_importance,
}


def least_important(importance: torch.Tensor, fraction: float,
                    scope: str = "global") -> list[tuple[int, int]]:
    """The (layer, head) pairs to prune: the lowest ``fraction`` of all heads, or of every layer.

    Ties break by (layer, head), so a given importance always gives the same heads.
    """
    check_choice("pruning", "scope", scope, PRUNE_SCOPES)
    if not 0.0 <= fraction <= 1.0:
        fail("pruning", "fraction", fraction, "must be in [0, 1]")
    n_layer, n_head = importance.shape
    heads = sorted((float(importance[l, h]), l, h) for l in range(n_layer) for h in range(n_head))
    if scope == "global":
        return [(l, h) for _, l, h in heads[:round(fraction * n_layer * n_head)]]
    per_layer = round(fraction * n_head)
    chosen = []
    for layer in range(n_layer):
        chosen += [(l, h) for _, l, h in heads if l == layer][:per_layer]
    return chosen


def pruning_curve(model: GPT, batches: Sequence[Batch], importance: torch.Tensor, *, scope: str = "global",
                  steps: int = 10) -> list[dict]:
    """Validation loss with the least important heads masked, at fractions 0, 1/steps, ..., 1.

    Fractions that round to the same heads are evaluated once. Each row: ``pruned`` (heads),
    ``fraction`` (pruned / all heads), ``loss``, ``loss_increase`` over the unpruned model, ``heads``.
    """
    check_positive_int("pruning", "steps", steps)
    n_heads = importance.numel()
    rows: list[dict] = []
    for step in range(steps + 1):
        heads = least_important(importance, step / steps, scope)
        if rows and len(heads) == rows[-1]["pruned"]:
            continue
        loss = mean_loss(model, batches, prune_heads(model, heads))
        rows.append({"pruned": len(heads), "fraction": len(heads) / n_heads, "loss": loss,
                     "loss_increase": loss - (rows[0]["loss"] if rows else loss),
                     "heads": [list(pair) for pair in heads]})
    return rows


def check_batches(batches: Sequence[Batch]) -> None:
    """A one-line ValueError for no batches: every measurement of a model averages over them."""
    if not batches:
        raise ValueError("batches is empty: head analysis needs at least one (x, y) validation batch")


# ---------------------------------------------------------------------------------------------------------
# Tables


def heads_table(heads: Sequence[Mapping[str, Any]]) -> str:
    """The per-head records (with their ``importance``) as a markdown table."""
    header = ["layer", "head", "kind", "entropy", "mean offset", "prev", "first", "delim", "importance"]
    rows = ([str(r["layer"]), str(r["head"]), r["kind"], f"{r['entropy']:.2f}", f"{r['mean_offset']:.1f}",
             f"{r['prev_token_mass']:.2f}", f"{r['first_token_mass']:.2f}", f"{r['delimiter_mass']:.2f}",
             f"{r['importance']:.4f}"] for r in heads)
    return format_table(header, rows, align="rrlrrrrrr")


def pruning_table(curve: Sequence[Mapping[str, Any]]) -> str:
    """The pruning curve as a markdown table."""
    rows = ([str(r["pruned"]), f"{r['fraction']:.2f}", f"{r['loss']:.4f}", f"{r['loss_increase']:+.4f}"]
            for r in curve)
    return format_table(["heads pruned", "fraction", "val loss", "increase"], rows, align="rrrr")
