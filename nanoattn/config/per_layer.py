"""Fields given per layer (an encoding, a window): one value for every layer, or a list cycled
over the layers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def cycled(value: Any) -> list[Any]:
    """The values a per-layer field cycles over: a single value, or its list."""
    return [value] if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) else list(value)


def per_layer(value: Any, n_layer: int) -> tuple[Any, ...]:
    """One value per layer: a single value repeated, or a list cycled ([a, b] -> a, b, a, b, ...)."""
    values = cycled(value)
    return tuple(values[i % len(values)] for i in range(n_layer))
