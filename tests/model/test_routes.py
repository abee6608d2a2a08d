"""The attention routes' choice and query chunks: functions of what the layer can take and of shapes."""

from __future__ import annotations

import pytest

from nanoattn.kernels import CAUSAL_QUERY_BLOCK
from nanoattn.model import routes


@pytest.mark.parametrize("fused, explicit, queries, keys, faster, expected", [
    (True, False, 40, 40, False, "sdpa_causal"),
    (True, False, 40, 40, True, "bf16_blocks"),
    (True, False, 1, 40, True, "sdpa_one_token"),  # timing is asked only where both are valid
    (True, False, 5, 40, False, "chunked_sdpa"),  # a prefix of cached keys needs a mask
    (False, False, 40, 40, True, "chunked_sdpa"),  # a bias: SDPA with the mask
    (False, True, 40, 40, True, "chunked_explicit"),  # a cap, sinks or another score function
    (False, True, 1, 40, False, "chunked_explicit"),
])
def test_the_route_follows_what_sdpa_can_compute_then_the_timing(fused, explicit, queries, keys, faster,
                                                                  expected):
    asked = []

    def bf16_faster(n: int) -> bool:
        asked.append(n)
        return faster

    assert routes.choose_route(fused=fused, explicit=explicit, queries=queries, keys=keys,
                               bf16_faster=bf16_faster) == expected
    assert asked == ([keys] if fused and queries == keys else [])


LONG = 2 * CAUSAL_QUERY_BLOCK + 22


@pytest.mark.parametrize("queries, keys, window",
                         [(40, 40, None), (7, 40, None), (LONG, LONG, None), (40, 40, 6), (1, 30, 6)])
def test_query_chunks_cover_every_query_once_within_the_budget_and_the_causal_keys(monkeypatch, queries,
                                                                                   keys, window):
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 7 * 40)  # 7 queries of 40 keys a chunk
    chunks = routes.query_chunks(2, 4, queries, keys, window)
    assert [c.start for c in chunks] == [0, *(c.stop for c in chunks[:-1])] and chunks[-1].stop == queries
    for c in chunks:
        assert 2 * 4 * (c.stop - c.start) * keys <= max(routes.MASK_CHUNK_ELEMENTS, 2 * 4 * keys)
        assert c.stop - c.start <= CAUSAL_QUERY_BLOCK or queries <= CAUSAL_QUERY_BLOCK
        assert c.last == keys - queries + c.stop  # up to the chunk's last query's own key
        newest_first = keys - queries + c.start  # the chunk's first query's own key
        assert c.first == (0 if window is None else max(0, newest_first - window + 1))
