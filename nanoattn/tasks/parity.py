"""Parity (Kazemnejad et al. 2023): ``0110=`` is answered by ``0`` (an even number of ones); size = bits."""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, symbols


class Parity(Task):
    name = "parity"
    alphabet = "01="

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        bits = symbols(rng, "01", size)
        return Instance(size, (Segment(bits + "="), Segment(str(bits.count("1") % 2), scored=True)))

    def max_tokens(self, size: int) -> int:
        return size + 2
