"""Copy and reverse (Kazemnejad et al. 2023): ``abc>`` answered by ``abc`` or ``cba``; size = symbols."""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, symbols

LETTERS = "abcdefghijklmnopqrstuvwxyz"


class Copy(Task):
    name = "copy"
    alphabet = LETTERS + ">"

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        text = symbols(rng, LETTERS, size)
        return Instance(size, (Segment(text + ">"), Segment(self.transform(text), scored=True)))

    def transform(self, text: str) -> str:
        return text

    def max_tokens(self, size: int) -> int:
        return 2 * size + 1


class Reverse(Copy):
    name = "reverse"

    def transform(self, text: str) -> str:
        return text[::-1]
