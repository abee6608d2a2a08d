"""Counting what matters (after CoPE's counting task): how often does the queried letter occur?

``abacbd?a=`` is answered by ``2``. Size = letters before the query. The queried letter occurs
1 to 9 times (uniformly, at most ``size``) wherever the size, and the others are drawn from the
remaining letters, so a longer instance asks for the same counts in a longer context and the
answer is always one digit: what changes with length is only how far the model must count.
"""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, symbols

LETTERS = "abcde"
MAX_COUNT = 9


class Counting(Task):
    name = "counting"
    alphabet = LETTERS + "?=123456789"

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        target = LETTERS[int(rng.integers(0, len(LETTERS)))]
        count = int(rng.integers(1, min(MAX_COUNT, size) + 1))
        chars = np.array(list(symbols(rng, LETTERS.replace(target, ""), size)))
        chars[rng.choice(size, size=count, replace=False)] = target
        return Instance(size, (Segment("".join(chars) + f"?{target}="), Segment(str(count), scored=True)))

    def max_tokens(self, size: int) -> int:
        return size + 4
