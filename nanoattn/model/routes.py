"""How an attention layer computes its heads: the routes, and the three decisions that pick one.

Every route computes the same function, causal ``score_fn(q.k / sqrt(d) + bias) v`` over heads (the
tests check each against the explicit computation):

- ``sdpa_causal``: SDPA with ``is_causal`` (flash or memory-efficient kernels: memory linear in T);
- ``bf16_blocks``: on CPU in bf16, two bf16 matmuls and a softmax over causal query blocks, each
  over only the keys it sees (``kernels.causal_query_blocks``);
- ``sdpa_one_token``: one new query over every cached key, each K/V head's query heads as the rows
  of one SDPA call: no mask, no repeated K/V;
- ``chunked_sdpa``: SDPA with an explicit mask (the encoding's bias, a window, a cached prefix),
  in query chunks;
- ``chunked_explicit``: the layer's own scores, weights and sum (a score cap, sinks, a score
  function other than the softmax, the largest logit kept), in query chunks.

The decisions, each in one place:

1. What can compute it (``choose_route``): SDPA's fused kernels take no bias, no cap, no sink and
   only the softmax, values as wide as queries, and every key inside the window; the layer says
   which of these hold (``fused``), never this module's business which mechanism it is.
2. What is faster here, where both are valid: the bf16 matmuls against SDPA, timed once per shape
   on this machine (``kernels.bf16_matmuls_faster``), asked only where they could be taken.
3. How much memory (``query_chunks``): a chunked route builds its mask or scores at most
   ``MASK_CHUNK_ELEMENTS`` at a time, in blocks of at most ``CAUSAL_QUERY_BLOCK`` queries, each over
   only the keys up to its last query and inside its first query's window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from nanoattn.kernels import CAUSAL_QUERY_BLOCK

ROUTES = ("sdpa_causal", "bf16_blocks", "sdpa_one_token", "chunked_sdpa", "chunked_explicit")
# Largest mask/bias chunk, in elements of [B, n_head, chunk, T_k], built at once on a chunked route.
MASK_CHUNK_ELEMENTS = 1 << 22


def choose_route(*, fused: bool, explicit: bool, queries: int, keys: int,
                 bf16_faster: Callable[[int], bool]) -> str:
    """The route for ``queries`` new queries over ``keys`` keys (the newest queries' own keys last).

    ``fused``: SDPA's fused kernels can compute this layer at these keys; ``explicit``: the layer
    needs its own scores (a chunked route then computes them explicitly); ``bf16_faster(keys)``: the
    bf16 matmuls beat SDPA at that many keys on this machine (asked only where both are valid).
    """
    if fused and queries == keys:
        return "bf16_blocks" if bf16_faster(keys) else "sdpa_causal"
    if fused and queries == 1:
        return "sdpa_one_token"
    return "chunked_explicit" if explicit else "chunked_sdpa"


class Chunk(NamedTuple):
    """Queries ``start:stop`` of a chunked route, over keys ``first:last``."""

    start: int
    stop: int
    first: int
    last: int


def query_chunks(batch: int, heads: int, queries: int, keys: int, window: int | None) -> list[Chunk]:
    """The query chunks of a chunked route: a chunk's [batch, heads, chunk, keys] mask stays within
    ``MASK_CHUNK_ELEMENTS``, a long input's chunks are at most ``CAUSAL_QUERY_BLOCK`` queries, and each
    chunk sees only the keys up to its last query (queries and keys end at the same, newest, token)
    and, with a window, none before its first query's window."""
    size = max(1, MASK_CHUNK_ELEMENTS // (batch * heads * keys))
    if queries > CAUSAL_QUERY_BLOCK:
        size = min(size, CAUSAL_QUERY_BLOCK)
    # One chunk without a range: compiled code then guards on queries <= size, not on size's value,
    # which changes with the cache's length at every decoding step.
    bounds = [(start, min(start + size, queries)) for start in range(0, queries, size)] if queries > size \
        else [(0, queries)]
    return [Chunk(start, stop, 0 if window is None else max(0, keys - queries + start - window + 1),
                  keys - queries + stop) for start, stop in bounds]
