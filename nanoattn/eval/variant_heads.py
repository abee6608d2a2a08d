"""Statistics of the attention variants' own pieces, the ``variants`` of heads.json.

A head's attention map (``heads.py``) says what it reads, not what a variant does around the
map: how far an output gate closes a head, what exclusive self-attention takes out of its output,
how many keys selective attention has masked for good. These are read off the variant's own
pieces, for the variants the model uses.

- ``variant_statistics`` reads forward hooks on the variant's pieces (``model/gates.py``) during
  the fast path, or its parameters: the output gate's mean value per head and the share of heads
  it keeps near 0, Scalable-Softmax's learned s and its factor at the windows' length, the share
  of each head's output that exclusive self-attention removes, the canon taps by distance.
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
from nanoattn.model import GPT, KVCache
from nanoattn.validation import fail

# attn_gate: a head whose gate averages below this is counted as switched off (its output mostly 0).
GATE_NEAR_ZERO = 0.1
# Selective attention: a key counts as masked once its F passes ln 100, when F has cut its unnormalised
# weight to a hundredth; the paper tunes memory budgets per layer instead.
SELECTIVE_PRUNE_F = math.log(100.0)


@torch.no_grad()
def variant_statistics(model: GPT, batches: Sequence[Batch]) -> dict[str, dict[str, Any]]:
    """The own statistic of each variant the model uses, by name ({} for none); per head and layer
    as lists [n_layer][heads], averaged like ``head_statistics`` over queries ``FIRST_QUERY``..

    - ``attn_gate``: ``mean_gate`` (each head's gate averaged over its channels), its ``mean`` and
      ``near_zero``, the fraction of heads whose mean gate is below ``GATE_NEAR_ZERO``;
    - ``ssmax``: the learned ``s`` per query head and ``factor``, s log n at the windows' last query;
    - ``xsa``: ``removed`` per query head, cos^2 between each output y_i and the token's value v_i:
      the share of |y_i|^2 that the exclusion takes out; and its ``mean``;
    - ``canon``: ``taps``, the mean |weight| per layer at distance 0 (the token), 1, ... back;
    - ``selective_attn``: ``selective_pruning`` at ``SELECTIVE_PRUNE_F``.
    """
    check_batches(batches)
    cfg, seq_len = model.cfg, batches[0][0].shape[1]
    attentions = [block.attn for block in model.blocks]
    sums = {"gate": torch.zeros(cfg.n_layer, cfg.attention_heads, dtype=torch.float64),
            "removed": torch.zeros(cfg.n_layer, cfg.n_head, dtype=torch.float64)}
    q = slice(FIRST_QUERY, None)

    def gate_hook(layer: int):
        def hook(module, args, logits):  # logits [B, T, heads or heads * Dv]
            B, T, _ = logits.shape
            gates = torch.sigmoid(logits.float()).view(B, T, cfg.attention_heads, -1).mean(-1)  # [B, T, H]
            sums["gate"][layer] += gates[:, q].sum((0, 1)).double().cpu()
        return hook

    def removed_hook(layer: int):
        def hook(module, args, out):
            y, v = (t.float() for t in args)  # [B, H, T, Dv], [B, Hkv, T, Dv]
            B, H, T, Dv = y.shape
            grouped = y.reshape(B, v.shape[1], -1, T, Dv)
            along = (grouped * torch.nn.functional.normalize(v, dim=-1)[:, :, None]).sum(-1)  # [B, Hkv, G, T]
            share = (along.square() / grouped.square().sum(-1).clamp(min=1e-30)).reshape(B, H, T)
            sums["removed"][layer] += share[..., q].sum((0, 2)).double().cpu()
        return hook

    hooks = []
    for layer, attn in enumerate(attentions):
        if attn.output_gate is not None:
            hooks.append(attn.output_gate.proj.register_forward_hook(gate_hook(layer)))
        if attn.exclude_self is not None:
            hooks.append(attn.exclude_self.register_forward_hook(removed_hook(layer)))
    queries = 0
    try:
        for x, _ in batches if hooks else ():
            model.hidden_states(x)
            queries += x.shape[0] * (x.shape[1] - FIRST_QUERY)
    finally:
        for handle in hooks:
            handle.remove()
    stats: dict[str, dict[str, Any]] = {}
    if cfg.attn_gate != "none":
        gate = sums["gate"] / queries
        stats["attn_gate"] = {"mean_gate": gate.tolist(), "mean": float(gate.mean()),
                              "near_zero": float((gate < GATE_NEAR_ZERO).double().mean())}
    if cfg.ssmax:
        last = torch.tensor([seq_len - 1], device=batches[0][0].device)
        stats["ssmax"] = {"s": [attn.ssmax.s.tolist() for attn in attentions],
                          "factor": [(attn.ssmax.s * attn.ssmax.keys_seen(last).float().log()).tolist()
                                     for attn in attentions]}
    if cfg.xsa:
        removed = sums["removed"] / queries
        stats["xsa"] = {"removed": removed.tolist(), "mean": float(removed.mean())}
    if cfg.canon:
        stats["canon"] = {"taps": [block.canon.weight.abs().mean(0).flip(0).tolist()
                                   for block in model.blocks]}
    if cfg.selective_attn:
        stats["selective_attn"] = selective_pruning(model, batches)
    return stats


def own_statistic(model: GPT, batches: Sequence[Batch]) -> tuple[str, float] | None:
    """The one number that says what the model's attention variant does, and its name, picked by the
    piece the model has (None: no piece of its own). A lab's table shows it beside the row's price.

    - ``attn_gate``: the mean gate; ``xsa``: the mean share removed; ``selective_attn``: the pruned
      fraction (``selective_pruning``); ``ssmax``: the mean factor s log n at the windows' length;
      ``canon``: the share of the taps' |weight| on the tokens before (1 - the token's own tap's);
    - from the attention maps (``head_statistics``), the mean over heads of: ``forget_gate``'s
      ``forget_span`` in tokens; stick-breaking's ``sink_mass``, the mass no key took; sigmoid's
      ``weight_sum``; ``attn_sinks``' ``sink_mass``, the mass the sink took.
    """
    cfg = model.cfg
    variants = variant_statistics(model, batches)
    if "attn_gate" in variants:
        return "mean gate", variants["attn_gate"]["mean"]
    if "xsa" in variants:
        return "share removed", variants["xsa"]["mean"]
    if "selective_attn" in variants:
        return "pruned fraction", variants["selective_attn"]["mean"]
    if "ssmax" in variants:
        return "s log n", float(torch.tensor(variants["ssmax"]["factor"]).mean())
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
