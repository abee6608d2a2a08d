"""Selective copy (the Mamba paper's task, as CoPE uses it): copy the letters, skip the blanks.

``a..c.b>`` is answered by ``acb``; size = input symbols, each a letter with probability 1/4
(at least one), so a longer instance has more letters spread over more blanks.
"""

from __future__ import annotations

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, symbols

LETTERS = "abcdefghijklmnop"
BLANK = "."


class SelectiveCopy(Task):
    name = "selective_copy"
    alphabet = LETTERS + BLANK + ">"

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        keep = rng.random(size) < 0.25
        keep[rng.integers(0, size)] = True
        letters = iter(symbols(rng, LETTERS, int(keep.sum())))
        text = "".join(next(letters) if k else BLANK for k in keep)
        return Instance(size, (Segment(text + ">"), Segment(text.replace(BLANK, ""), scored=True)))

    def max_tokens(self, size: int) -> int:
        return 2 * size + 1
