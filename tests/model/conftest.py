"""Fixtures of the model tests."""

from __future__ import annotations

import pytest

from nanoattn.model import routes


@pytest.fixture
def chunks_built(monkeypatch) -> list[tuple[int, int, int]]:
    """(queries, keys, elements) of every chunk a chunked attention route builds from here on (its mask,
    bias or scores: [B, n_head, queries, keys] elements), as ``routes.query_chunks`` plans them."""
    built: list[tuple[int, int, int]] = []
    plan = routes.query_chunks

    def spy(batch, heads, queries, keys, window):
        chunks = plan(batch, heads, queries, keys, window)
        built.extend((stop - start, last - first, batch * heads * (stop - start) * (last - first))
                     for start, stop, first, last in chunks)
        return chunks

    monkeypatch.setattr(routes, "query_chunks", spy)
    return built


@pytest.fixture
def small_chunks(monkeypatch) -> int:
    """Each chunk's budget set to 1 << 16 elements (16 queries over 4 heads and 1,024 keys); the budget."""
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 1 << 16)
    return 1 << 16
