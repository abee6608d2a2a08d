"""Fixtures of the model tests."""

from __future__ import annotations

import pytest

from nanoattn.model import attention as attention_module
from nanoattn.model import routes


@pytest.fixture
def mask_sizes(monkeypatch) -> list[int]:
    """The element count of every attention mask chunk built from here on, each chunk's budget set to
    1 << 16 elements."""
    sizes: list[int] = []
    original = attention_module.Attention._mask

    def spy(self, *args):
        mask = original(self, *args)
        sizes.append(mask.numel())
        return mask

    monkeypatch.setattr(attention_module.Attention, "_mask", spy)
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 1 << 16)
    return sizes
