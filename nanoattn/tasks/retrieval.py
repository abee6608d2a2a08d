"""The RULER tasks (Hsieh et al. 2024), sized for byte-level tiny models: filler text with statements.

Size = the instance's tokens (filler, statements, question and answer), so the filler grows with
the size and the statements stay. The statements are compact (``<KEY=1234>``; ``<` and ``>`` do
not occur in the Shakespeare filler) where RULER writes sentences, which at 128 tokens would leave
no room for filler.

- Multi-key needle (RULER's ``niah_multikey``): ``NEEDLES`` key-value needles with distinct keys at
  random depths; the question ``?KEY=`` asks for one key's 4-digit value.
- Variable tracking (RULER's ``vt``): chains ``<AB=1234>`` then ``<CD=AB>`` then ``<EF=CD>`` (in
  that order, at random depths), a target chain and a distractor chain with another value,
  interleaved; ``?1234:`` asks for every variable that holds the target value, in chain order
  (``AB,CD,EF``).
"""

from __future__ import annotations

import itertools

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, unique_words, with_filler

KEY_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
DIGITS = "0123456789"
NEEDLES = 4
VARIABLES_PER_CHAIN = 3


class MultiKeyNeedle(Task):
    name = "multikey_needle"
    train_length = 128
    alphabet = KEY_LETTERS + DIGITS + "<=>?"
    uses_filler = True
    min_size = 64

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        keys = unique_words(rng, KEY_LETTERS, 3, NEEDLES)
        values = unique_words(rng, DIGITS, 4, NEEDLES)
        asked = int(rng.integers(0, NEEDLES))
        question = f"?{keys[asked]}="
        needles = [f"<{k}={v}>" for k, v in zip(keys, values, strict=True)]
        body = with_filler(rng, filler, size, len(question) + 4, needles, self.name)
        return Instance(size, (*body, Segment(question), Segment(values[asked], scored=True)))

    def max_tokens(self, size: int) -> int:
        return size


class VariableTracking(Task):
    name = "variable_tracking"
    train_length = 128
    alphabet = KEY_LETTERS + DIGITS + "<=>?:,"
    uses_filler = True
    min_size = 64

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        names = unique_words(rng, KEY_LETTERS, 2, 2 * VARIABLES_PER_CHAIN)
        values = unique_words(rng, DIGITS, 4, 2)
        chains = [names[:VARIABLES_PER_CHAIN], names[VARIABLES_PER_CHAIN:]]
        statements = [[f"<{chain[0]}={value}>", *(f"<{b}={a}>" for a, b in itertools.pairwise(chain))]
                      for chain, value in zip(chains, values, strict=True)]
        # Interleave the two chains at random while each keeps its order.
        order = rng.permutation([0] * VARIABLES_PER_CHAIN + [1] * VARIABLES_PER_CHAIN)
        queues = [iter(s) for s in statements]
        inserts = [next(queues[c]) for c in order]
        answer = ",".join(chains[0])
        question = f"?{values[0]}:"
        body = with_filler(rng, filler, size, len(question) + len(answer), inserts, self.name)
        return Instance(size, (*body, Segment(question), Segment(answer, scored=True)))

    def max_tokens(self, size: int) -> int:
        return size
