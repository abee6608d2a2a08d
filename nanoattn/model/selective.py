"""Selective attention (Leviathan et al. 2024, arXiv:2410.02703, "Selective Attention Improves
Transformer"), section 3, and its context pruning.

In each layer one head's logits (head 0, as the paper's sketch) decide which earlier tokens later
queries stop attending to. For queries i and keys j, with L the logits of head 0:

    S_ij = ReLU(L_ij) for j < i and j not the first token, else 0
           (causal: a masked logit is -inf; "do not mask <BOS>": the key at position 0; "do not mask
           self": the diagonal),
    F_ij = sum_{k < i} S_kj   (the sketch's roll by one query and cumsum: a token's choice acts on
           the queries after it),

and every head's logits become L_h - F before the softmax. L is what the softmax would see without
F: q.k / sqrt(d), soft-capped, plus the encoding's bias (the sketch takes the logits after the
causal mask, with whatever the model adds to them). Gradients flow through S, as in the sketch.

Design:
- F enters attention as an additive bias (``SelectiveBias``, which stands in for the layer's
  encoding in attention's chunks and masks), so SDPA with a mask, the explicit chunks and the
  weights of the slow path compute the same function and no path branches on it. F is never
  built whole: for a chunk of queries it is the column sums of S over every earlier query plus
  the cumulative sum within the chunk, and the sums then grow by the chunk's. Evaluation memory is
  therefore linear in the length ([B, T] sums and one chunk); training's backward keeps every
  chunk's tensors, as for any explicit attention. Chunks must come in order, queries
  ascending, which attention's query loop does.
- The KV cache keeps the column sums for its keys (``KVCache.selection``): a new query's row of F
  is those sums, so cached decoding equals recomputation. The keys of a chunk start at position 0
  (no window: ``ModelConfig`` refuses ``sliding_window`` with it, and ``check_streamable`` the
  StreamingLLM cache, whose evictions would move the sums).
- Context pruning (the paper's section on pruning): S >= 0, so F only grows down a column, and a key
  whose F passes a threshold for one query does for every later one. With
  ``KVCache(prune_threshold=tau)`` (``generate(..., prune_threshold=tau)``) a query attends only to
  keys with F <= tau; the others are dropped for good, which is the function a cache evicting
  them computes, prefill and decoding alike. The first token and the query itself always have F = 0,
  so no query loses every key. ``KVCache.pruned_tokens`` / ``pruned_bytes`` report what was
  dropped. The paper sets per-layer memory budgets and evicts the keys of highest F when one is
  full; a threshold is the rule without a tuned budget.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from nanoattn.model.cache import KVCache
from nanoattn.positional.base import PositionalEncoding


def selection(logits: torch.Tensor) -> torch.Tensor:
    """S from head 0's logits [B, Tq, Tk] of the newest Tq of Tk tokens: ReLU of the logits of earlier
    keys, 0 for the first token, the query itself and later keys. float32 [B, Tq, Tk].

    "Earlier" and "first" are by token order, as the causal mask is, never by position: given
    positions [B, T] may repeat or go back (position coupling) and differ between rows."""
    Tq, Tk = logits.shape[-2:]
    order = torch.arange(Tk, device=logits.device)
    earlier = (order[None, :] < order[Tk - Tq:, None]) & (order[None, :] > 0)  # [Tq, Tk]
    return logits.float().relu().masked_fill(~earlier, 0.0)


class SelectiveBias:
    """One layer's encoding with F subtracted from its bias, for one forward pass: asked by attention
    for one chunk of queries after another (``bias``), it keeps F's column sums between them."""

    adds_bias = True

    def __init__(self, pos: PositionalEncoding, sums: torch.Tensor,
                 cap: Callable[[torch.Tensor], torch.Tensor], cache: KVCache | None, layer: int) -> None:
        """``sums`` [B, Tk]: F's column sums over the queries before the first chunk; ``cap``: what
        attention does to q.k / sqrt(d) before the bias (its mechanisms' ``scores`` hooks, each acting
        on each score alone: ModelConfig refuses one that mixes heads)."""
        self.pos, self.sums, self.cap, self.cache, self.layer = pos, sums, cap, cache, layer
        self.threshold = None if cache is None else cache.prune_threshold

    @classmethod
    def start(cls, pos: PositionalEncoding, q: torch.Tensor, k: torch.Tensor,
              cap: Callable[[torch.Tensor], torch.Tensor], cache: KVCache | None,
              layer: int) -> SelectiveBias:
        """Before the chunks of queries q [B, H, Tq, D] over keys k [B, Hkv, Tk, D]: the cached keys'
        column sums (none without a cache), zeros for the new keys, which no earlier query selected."""
        B, Tq, Tk = q.shape[0], q.shape[2], k.shape[2]
        new = torch.zeros(B, Tq, device=q.device)
        cached = new[:, :0] if cache is None else cache.selection[layer][:, :Tk - Tq]
        return cls(pos, torch.cat([cached, new], dim=1), cap, cache, layer)  # [B, Tk]

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor,
             layer: int) -> torch.Tensor:
        """The encoding's bias minus F for this chunk, -inf where pruning dropped a key:
        [B, H or 1, Tq, Tk]."""
        inner = self.pos.bias(q, k, q_positions, k_positions, layer)  # None, [H, Tq, Tk] or [B, H, Tq, Tk]
        scale = 1 / math.sqrt(q.shape[-1])
        logits = (q[:, 0].float() * scale) @ k[:, 0].float().transpose(-2, -1)  # head 0: [B, Tq, Tk]
        logits = self.cap(logits)
        if inner is not None:
            logits = logits + inner[..., 0, :, :].float()
        s = selection(logits)  # [B, Tq, Tk]
        keys = k.shape[2]  # the chunk's keys: positions 0 .. keys - 1
        earlier = self.sums[:, None, :keys]  # [B, 1, Tk]: every query before the chunk
        f = earlier + F.pad(s, (0, 0, 1, 0))[:, :-1].cumsum(dim=1)  # [B, Tq, Tk]: and the chunk's before each
        self.sums = torch.cat([self.sums[:, :keys] + s.sum(dim=1), self.sums[:, keys:]], dim=1)
        if self.cache is not None:
            self.cache.selection[self.layer][:, :self.sums.shape[1]] = self.sums.detach()
        out = -f[:, None]  # [B, 1, Tq, Tk]
        if inner is not None:
            out = out + inner.float()
        if self.threshold is not None:
            out = out.masked_fill((f > self.threshold)[:, None], float("-inf"))
        return out
