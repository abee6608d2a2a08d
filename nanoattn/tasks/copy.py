"""Copy and reverse (Kazemnejad et al. 2023): ``abc>`` answered by ``abc`` or ``cba``; size = symbols.

``position_coupling`` (Cho et al. 2024) gives each symbol of the input and its copy in the answer one
position id, as the authors' ``CopyDatasetWithCoupledPositions`` from start s = 1: for copy, input
symbol i (1-based) and its copy at s + i, ``>`` at s; for reverse, input symbol i at s + i - 1, ``>``
at s + n, and the answer's symbols back down to s. Training starts at a random s (``for_training``).
"""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, shifted_positions, symbols

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Copy(Task):
    name = "copy"
    alphabet = LETTERS + ">"
    options = ("position_coupling", "max_position")

    def __init__(self, position_coupling: bool = False, max_position: int | None = None) -> None:
        self.position_coupling, self.max_position = position_coupling, max_position

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        text = symbols(rng, LETTERS, size)
        return Instance(size, (Segment(text + ">"), Segment(self.transform(text), scored=True)),
                        self.coupled(size) if self.position_coupling else None)

    def transform(self, text: str) -> str:
        return text

    def coupled(self, size: int) -> tuple[int, ...]:
        """Position ids of the input, ``>`` and the answer, from start 1."""
        copies = tuple(range(2, size + 2))
        return (*copies, 1, *copies)

    def for_training(self, instance: Instance, rng: np.random.Generator) -> Instance:
        return shifted_positions(instance, rng, self.max_position) if self.position_coupling else instance

    def max_tokens(self, size: int) -> int:
        return 2 * size + 1


class Reverse(Copy):
    name = "reverse"

    def transform(self, text: str) -> str:
        return text[::-1]

    def coupled(self, size: int) -> tuple[int, ...]:
        inputs = tuple(range(1, size + 1))
        return (*inputs, size + 1, *inputs[::-1])
