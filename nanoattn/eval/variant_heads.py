"""Statistics of the attention variants' own pieces, the ``variants`` of heads.json.

A head's attention map (``heads.py``) says what it reads, not what a variant does around the
map: how far an output gate closes a head, what exclusive self-attention takes out of its output,
how many keys selective attention has masked for good. These are read off the variant's own
pieces, for the variants the model uses.

- ``variant_statistics`` asks each mechanism the model uses for its ``statistic``
  (``nanoattn.mechanisms``), recording its hooks during the fast path where it needs them, and
  reads the canon taps by distance.
- Selective attention masks keys for a whole layer, so its statistic is the layer's
  (``selective_pruning``), read off a KV cache that prunes at ``SELECTIVE_PRUNE_F``: the fraction
  of a window's tokens the last query no longer sees, the K/V bytes that frees, and the mean share
  1 - exp(-F) of a token's unnormalised weight that F takes from the next query (0: nothing
  masked, 1: everything).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

import torch

from nanoattn.eval.heads import FIRST_QUERY, Batch, check_batches, head_statistics
from nanoattn.mechanisms import REGISTRY as MECHANISMS
from nanoattn.mechanisms import used_mechanisms
from nanoattn.model import GPT, KVCache
from nanoattn.validation import fail

# Selective attention: a key counts as masked once its F passes ln 100, when F has cut its unnormalised
# weight to a hundredth; the paper tunes memory budgets per layer instead.
SELECTIVE_PRUNE_F = math.log(100.0)


@torch.no_grad()
def variant_statistics(model: GPT, batches: Sequence[Batch]) -> dict[str, dict[str, Any]]:
    """The own statistic of each variant the model uses, by name ({} for none); per head and layer
    as lists [n_layer][heads], averaged like ``head_statistics`` over queries ``FIRST_QUERY``..

    - each mechanism of ``nanoattn.mechanisms`` the model uses: its ``statistic`` (its module says
      what it holds), over forward passes of ``batches`` recorded by its hooks where it ``observes``;
    - ``canon``: ``taps``, the mean |weight| per layer at distance 0 (the token), 1, ... back;
    - ``selective_attn``: ``selective_pruning`` at ``SELECTIVE_PRUNE_F``.
    """
    check_batches(batches)
    cfg, seq_len = model.cfg, batches[0][0].shape[1]
    used = {name: [getattr(block.attn, mechanism.attribute) for block in model.blocks]
            for name, mechanism in used_mechanisms(cfg).items()}
    observing = [layer for name, layers in used.items() if MECHANISMS[name].observes for layer in layers]
    for layer in observing:
        layer.record(FIRST_QUERY)
    try:
        for x, _ in batches if observing else ():
            model.hidden_states(x)
        stats = {name: MECHANISMS[name].statistic(layers, seq_len) for name, layers in used.items()}
    finally:
        for layer in observing:
            layer.record(None)
    stats = {name: stat for name, stat in stats.items() if stat is not None}
    if cfg.canon:
        stats["canon"] = {"taps": [block.canon.weight.abs().mean(0).flip(0).tolist()
                                   for block in model.blocks]}
    if cfg.selective_attn:
        stats["selective_attn"] = selective_pruning(model, batches)
    return stats


def own_statistic(model: GPT, batches: Sequence[Batch]) -> tuple[str, float] | None:
    """The one number that says what the model's attention variant does, and its name, picked by the
    piece the model has (None: no piece of its own). A lab's table shows it beside the row's price.

    - the first mechanism the model uses that has one (``Mechanism.headline``: the output gate's mean,
      exclusive self-attention's mean share removed, Scalable-Softmax's mean s log n...);
    - ``selective_attn``: the pruned fraction (``selective_pruning``); ``canon``: the share of the
      taps' |weight| on the tokens before (1 - the token's own tap's);
    - from the attention maps (``head_statistics``), the mean over heads of: ``forget_gate``'s
      ``forget_span`` in tokens; stick-breaking's ``sink_mass``, the mass no key took; sigmoid's
      ``weight_sum``; ``attn_sinks``' ``sink_mass``, the mass the sink took.
    """
    cfg = model.cfg
    variants = variant_statistics(model, batches)
    for name in used_mechanisms(cfg):
        headline = MECHANISMS[name].headline(variants[name]) if name in variants else None
        if headline is not None:
            return headline
    if "selective_attn" in variants:
        return "pruned fraction", variants["selective_attn"]["mean"]
    if "canon" in variants:
        taps = torch.tensor(variants["canon"]["taps"])  # [n_layer, width], distance 0 first
        return "tap share before", float((1 - taps[:, 0] / taps.sum(-1)).mean())
    from_maps = (("forget span", "forget_span", cfg.forget_gate),
                 ("unassigned mass", "sink_mass", cfg.attn_fn == "stick_breaking"),
                 ("weight sum", "weight_sum", cfg.attn_fn == "sigmoid"),
                 ("sink mass", "sink_mass", cfg.attn_sinks))
    picked = next(((label, name) for label, name, used in from_maps if used), None)
    if picked is None:
        return None
    heads = head_statistics(model, batches)
    return picked[0], statistics.fmean(record[picked[1]] for record in heads)


@torch.no_grad()
def selective_pruning(model: GPT, batches: Sequence[Batch],
                      threshold: float = SELECTIVE_PRUNE_F) -> dict[str, Any]:
    """A selective-attention model over the windows of ``batches``, lists per layer: ``pruned_fraction``,
    the share of a window's tokens whose F has passed ``threshold`` by its end (context pruning drops
    them), ``pruned_kv_bytes`` per window, what dropping them frees, and ``masked_mass``, the mean of
    1 - exp(-F) over the window's tokens for the query after it; ``mean``, the pruned fraction over
    the layers, and the ``threshold``."""
    check_batches(batches)
    cfg = model.cfg
    if not cfg.selective_attn:
        fail("model", "selective_attn", cfg.selective_attn, "must be true for selective_pruning: the model "
             "has no selection to prune by")
    pruned, freed, mass = (torch.zeros(cfg.n_layer, dtype=torch.float64) for _ in range(3))
    tokens, windows = 0, 0
    for x, _ in batches:
        B, T = x.shape
        cache = KVCache(cfg, B, T, device=x.device, dtype=model.tok_emb.weight.dtype,
                        prune_threshold=threshold)
        model.hidden_states(x, cache=cache)
        pruned += torch.tensor(cache.pruned_tokens(), dtype=torch.float64)
        freed += torch.tensor(cache.pruned_bytes(), dtype=torch.float64)
        mass += torch.stack([(1 - torch.exp(-sums)).sum().double().cpu() for sums in cache.selection])
        tokens, windows = tokens + B * T, windows + B
    fraction = pruned / tokens
    return {"threshold": float(threshold), "pruned_fraction": fraction.tolist(),
            "pruned_kv_bytes": (freed / windows).tolist(), "masked_mass": (mass / tokens).tolist(),
            "mean": float(fraction.mean())}
