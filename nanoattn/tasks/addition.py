"""Multi-digit addition (Kazemnejad et al. 2023): ``457+83=`` answered by the sum; size = digits.

Both operands have exactly ``size`` digits (no leading zero). With ``reversed_answer`` (the
default) the sum is written least significant digit first (``045`` for 540), the order in which
carries are computed, which Lee et al. 2023 found far easier to learn; off, it is written as usual.

A run trains on up to 4 digits by default, the answer reversed, under a curriculum: operands of 1
digit, then up to 2 and 3, 250 steps each, then every size from 1 to 4. The steps to learn
addition grow fast with its digits: at 4, both NoPE and RoPE learn it at 1x within the task lab's
CPU budget, and the curriculum is what gets them there that soon (docs/tasks.md).
"""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task


class Addition(Task):
    name = "addition"
    train_length = 4
    curriculum_steps = 1000
    alphabet = "0123456789+="
    options = ("reversed_answer",)

    def __init__(self, reversed_answer: bool = True) -> None:
        self.reversed_answer = reversed_answer

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        a, b = (_number(rng, size) for _ in range(2))
        total = str(int(a) + int(b))
        answer = total[::-1] if self.reversed_answer else total
        return Instance(size, (Segment(f"{a}+{b}="), Segment(answer, scored=True)))

    def max_tokens(self, size: int) -> int:
        return 3 * size + 3


def _number(rng: np.random.Generator, digits: int) -> str:
    """A ``digits``-digit decimal number as text, its first digit nonzero (``0`` allowed for one digit)."""
    first = str(rng.integers(1 if digits > 1 else 0, 10))
    return first + "".join(map(str, rng.integers(0, 10, size=digits - 1)))
