"""Flip-flop language modelling (Liu et al. 2023): remember the last written bit across distractors.

A sequence of ``size`` instructions, each an op and a bit: ``w`` writes the bit, ``i`` is
ignored, ``r`` must read back the last written bit (scored; the other bits are random). The first
instruction writes and the last reads; in between each is ``i`` with probability ``ignore_prob``
and ``w`` or ``r`` with equal shares of the rest: the paper's sparse FFL(0.98), standard 0.8 (the
default) and dense 0.1. ``w1i0r1`` is three instructions, its scored answer the final ``1``.
"""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task


class FlipFlop(Task):
    name = "flip_flop"
    train_length = 24
    alphabet = "wir01"
    min_size = 2
    options = ("ignore_prob",)

    def __init__(self, ignore_prob: float = 0.8) -> None:
        self.ignore_prob = ignore_prob

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        other = (1.0 - self.ignore_prob) / 2
        ops = ["w", *rng.choice(["i", "w", "r"], size=size - 2, p=[self.ignore_prob, other, other]), "r"]
        segments, text, memory = [], "", ""
        for op in ops:
            if op == "r":
                segments += [Segment(text + "r"), Segment(memory, scored=True)]
                text = ""
                continue
            bit = str(rng.integers(0, 2))
            memory = bit if op == "w" else memory
            text += op + bit
        return Instance(size, tuple(segments))

    def max_tokens(self, size: int) -> int:
        return 2 * size
