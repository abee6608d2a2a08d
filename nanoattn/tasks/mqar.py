"""Multi-query associative recall (Arora et al. 2023, Zoology, arXiv:2312.04927): key-value pairs, then
every key again, each answered by its value; size = pairs.

``a1B7c2>B7a1c2``: the pairs (a key letter, then its value digit), ``>``, then each key once in a
random order followed by its value, which is scored. As in Zoology, keys and values are tokens of
disjoint sets and several queries share one context; its queries sit at random gaps in a longer
sequence, here they follow each other. Keys are distinct letters, so an instance has at most 52 pairs.
This is the recall probe the linear-attention papers report: a state of fixed size must hold every
pair to answer them all.
"""

from __future__ import annotations

import string

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task

KEYS = string.ascii_letters
VALUES = string.digits


class MultiQueryRecall(Task):
    name = "mqar"
    alphabet = KEYS + VALUES + ">"
    train_length = 12  # 4x it, the task lab's farthest factor, is 48 pairs: within the 52 keys

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        if size > len(KEYS):
            raise ValueError(f"task mqar: size={size} pairs is invalid: at most {len(KEYS)}, "
                             "one letter a key")
        keys = rng.choice(list(KEYS), size, replace=False)
        values = rng.choice(list(VALUES), size)
        queries = [piece for i in rng.permutation(size)
                   for piece in (Segment(str(keys[i])), Segment(str(values[i]), scored=True))]
        pairs = "".join(k + v for k, v in zip(keys, values, strict=True))
        return Instance(size, (Segment(pairs + ">"), *queries))

    def max_tokens(self, size: int) -> int:
        return 4 * size + 1
