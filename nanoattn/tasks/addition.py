"""Multi-digit addition (Kazemnejad et al. 2023): ``457+83=`` answered by the sum; size = digits.

Both operands have exactly ``size`` digits (no leading zero). With ``reversed_answer`` (the
default) the sum is written least significant digit first (``045`` for 540), the order in which
carries are computed, which Lee et al. 2023 found far easier to learn; off, it is written as usual.

A run trains on up to 4 digits by default, the answer reversed, under a curriculum: operands of 1
digit, then up to 2 and 3, 250 steps each, then every size from 1 to 4. The steps to learn
addition grow fast with its digits: at 4, both NoPE and RoPE learn it at 1x within the task lab's
CPU budget, and the curriculum is what gets them there that soon (docs/tasks.md).

``reversed_operands`` writes the operands least significant digit first too, McLeish et al.'s
format, in which Abacus embeddings (``model.abacus``, counting each number's digits from its first
written one) give one index to one significance in all three numbers.

Two options give the training distribution and the format of the papers' own code:

- ``independent_lengths``: in training, each operand's number of digits is drawn on its own, uniform
  in [1, D] (Cho et al.'s ``AdditionDatasetWithCoupledPositions``; McLeish et al. train on every pair
  of lengths), where by default both operands of an instance have one size. Evaluation scores
  operands of exactly the bin's digits, as both papers do.
- ``zero_padded`` (Cho et al.'s ``padding: True``, pad token ``0``): the shorter operand is written
  with leading zeros to the longer's n digits and the sum with them to n + 1 digits, so every digit
  of a place, padding included, has its place's position id and the answer a fixed length.

A digit's place is its significance (units: 0). Two options mark places, as their papers do:

- ``position_coupling`` (Cho et al. 2024, arXiv:2405.20671): digits of one place in the operands and
  the answer share one position id, the model's position for them. As the authors' code
  (HanseulJo/position-coupling, ``AdditionDatasetWithCoupledPositions``: "least significant digit
  has least position ID") from start s = 1: a digit of place j is at s + 1 + j, ``+`` at s, and ``=``
  at s with the answer reversed (at s + its digits + 1 otherwise); the row's EOTs at 0. Training
  starts at a random s (``for_training``): the ids move up by an offset uniform in
  [0, max_position - the instance's largest].
- ``index_hints`` (Zhou et al. 2023, arXiv:2310.16028): every digit, in the operands and the
  answer, is preceded by a hint letter naming its place, ``HINTS[j]`` for place j, so ``123+45=``
  reads ``c1b2a3+b4a5=`` and its answer ``a8b6c1``. Training starts the hints at a random letter
  (place j takes ``HINTS[h + j]``, h uniform so the instance's places fit), so the letters of longer
  instances are trained too, as Cho et al.'s reimplementation of Zhou et al.'s hints does;
  evaluation starts at ``a``. The hints are scored with the answer digits they precede.
"""

from __future__ import annotations

import string

import numpy as np

from nanoattn.tasks.base import Instance, Segment, Task, shifted_positions

HINTS = string.ascii_lowercase + string.ascii_uppercase  # index hints in place order: HINTS[j] names place j


class Addition(Task):
    name = "addition"
    train_length = 4
    curriculum_steps = 1000
    alphabet = "0123456789+=" + HINTS
    options = ("reversed_answer", "reversed_operands", "position_coupling", "max_position", "index_hints",
               "independent_lengths", "zero_padded")

    def __init__(self, reversed_answer: bool = True, reversed_operands: bool = False,
                 position_coupling: bool = False, max_position: int | None = None, index_hints: bool = False,
                 independent_lengths: bool = False, zero_padded: bool = False) -> None:
        self.reversed_answer, self.reversed_operands = reversed_answer, reversed_operands
        self.position_coupling, self.max_position = position_coupling, max_position
        self.index_hints = index_hints
        self.independent_lengths, self.zero_padded = independent_lengths, zero_padded

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        return self.written(*(_number(rng, size) for _ in range(2)))

    def training_size(self, rng: np.random.Generator, low: int, high: int) -> int:
        """With independent lengths every training instance is drawn at the largest size and its
        operands' lengths on their own (``for_training``); else a size uniform in [low, high]."""
        return high if self.independent_lengths else super().training_size(rng, low, high)

    def written(self, a: str, b: str) -> Instance:
        """The instance a + b (decimal text, most significant digit first) as this task writes it, with
        its position ids (position coupling) and hints at their evaluation start."""
        size = max(len(a), len(b))
        if self.index_hints and size + 1 > len(HINTS):
            raise ValueError(f"task addition with index hints: {size} digits need {size + 1} hint letters, "
                             f"more than the {len(HINTS)} it has")
        total = str(int(a) + int(b))
        if self.zero_padded:
            a, b, total = a.zfill(size), b.zfill(size), total.zfill(size + 1)
        numbers = [self._places(n, self.reversed_operands) for n in (a, b)]
        answer = self._places(total, self.reversed_answer)
        question = [*numbers[0], ("+", None), *numbers[1], ("=", None)]
        start = 1  # s, the authors' evaluation start
        operators = {"+": start, "=": start if self.reversed_answer else start + len(total) + 1}
        positions = tuple(operators[char] if place is None else start + 1 + place
                          for char, place in question + answer)
        text = [self._text(tokens) for tokens in (question, answer)]
        return Instance(size, (Segment(text[0]), Segment(text[1], scored=True)),
                        positions if self.position_coupling else None)

    @staticmethod
    def _places(number: str, reversed_: bool) -> list[tuple[str, int]]:
        """(digit, place) in written order: most significant first, or least with ``reversed_``."""
        digits = [(digit, len(number) - 1 - i) for i, digit in enumerate(number)]
        return digits[::-1] if reversed_ else digits

    def _text(self, tokens: list[tuple[str, int | None]]) -> str:
        if not self.index_hints:
            return "".join(char for char, _ in tokens)
        return "".join(char if place is None else HINTS[place] + char for char, place in tokens)

    def for_training(self, instance: Instance, rng: np.random.Generator) -> Instance:
        if self.independent_lengths:  # operands of lengths drawn on their own, up to the instance's size
            lengths = rng.integers(1, instance.size + 1, size=2)
            instance = self.written(*(_number(rng, int(n)) for n in lengths))
        if self.position_coupling:
            instance = shifted_positions(instance, rng, self.max_position)
        if self.index_hints:
            places = instance.size + 1  # places 0..size: the sum's last carry included
            start = int(rng.integers(0, len(HINTS) - places + 1))
            moved = str.maketrans(HINTS[:places], HINTS[start:start + places])
            instance = Instance(instance.size, tuple(Segment(s.piece.translate(moved), s.scored)
                                                     for s in instance.segments), instance.positions)
        return instance

    def max_tokens(self, size: int) -> int:
        digits = 3 * size + 1  # the operands' and the sum's (padded or not)
        return 2 + (2 * digits if self.index_hints else digits)


def _number(rng: np.random.Generator, digits: int) -> str:
    """A ``digits``-digit decimal number as text, its first digit nonzero (``0`` allowed for one digit)."""
    first = str(rng.integers(1 if digits > 1 else 0, 10))
    return first + "".join(map(str, rng.integers(0, 10, size=digits - 1)))
