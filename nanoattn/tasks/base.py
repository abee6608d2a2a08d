"""What every task is: a seeded generator of instances whose answers are exact.

Design choices:

- An instance is a list of segments, each task text or filler, each scored or not. Task text uses
  only the task's ``alphabet`` (one token a character with the byte or char tokenizer); filler is
  token ids taken as they are from a corpus split (the RULER tasks), so a filler slice is real
  text of an exact number of tokens. Scored segments are the answer: the loss and the accuracy
  count only them (flip-flop has one scored bit per read, the other tasks one answer at the end).
- ``size`` is the task's own length: symbols for copy, digits per operand for addition,
  instructions for flip-flop, tokens for the filler tasks. Training draws sizes in
  ``[min_size, L]``; evaluation draws them in bins up to 4 L. ``max_tokens(size)`` bounds the
  tokens of an instance of that size, so a batch's width is known before any instance is drawn.
- Generators are pure functions of a NumPy ``Generator``: a seed reproduces the instance.
- An instance may give each of its tokens a position id (``positions``: position coupling), which
  the model then takes instead of 0..T-1; the row's leading EOT is at 0. Its training form
  (``for_training``) may start its position ids or index hints at a random offset, so that the
  ids or hints of longer instances are trained too; evaluation takes instances as drawn.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

Piece = str | np.ndarray  # task text, or filler token ids
# The size factors an evaluation scores by default (nanoattn.eval.tasks): the largest sets how far
# position ids must have been trained (position coupling's max_position).
EVAL_FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0)


@dataclass(frozen=True)
class Segment:
    piece: Piece
    scored: bool = False


@dataclass(frozen=True)
class Instance:
    """One problem: its size, its segments in order, and its tokens' position ids (None: 1, 2, ...
    after the row's leading EOT, the model's default)."""

    size: int
    segments: tuple[Segment, ...]
    positions: tuple[int, ...] | None = None


class Task(abc.ABC):
    """A task of the suite: ``instance(rng, size, filler)`` draws one problem of that size."""

    name: ClassVar[str]
    alphabet: ClassVar[str]  # every character of its text
    min_size: ClassVar[int] = 1
    train_length: ClassVar[int] = 16  # the largest training size a run of this task takes by default
    curriculum_steps: ClassVar[int] = 0  # its default size curriculum (TaskConfig.curriculum_steps)
    uses_filler: ClassVar[bool] = False
    options: ClassVar[tuple[str, ...]] = ()  # TaskConfig fields this task reads

    @abc.abstractmethod
    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        """A problem of ``size`` (filler: the token ids to take filler from, for ``uses_filler`` tasks)."""

    @abc.abstractmethod
    def max_tokens(self, size: int) -> int:
        """The most tokens an instance of ``size`` has (one token a character of text)."""

    def training_size(self, rng: np.random.Generator, low: int, high: int) -> int:
        """The size a training instance is drawn at, given the sizes allowed: uniform in [low, high]."""
        return int(rng.integers(low, high + 1))

    def for_training(self, instance: Instance, rng: np.random.Generator) -> Instance:
        """The form ``instance`` is trained in: its position ids or hints from a random start drawn
        from ``rng``, for a task that has them; otherwise the instance itself."""
        return instance


def shifted_positions(instance: Instance, rng: np.random.Generator, max_position: int) -> Instance:
    """``instance`` with every position id moved up by one offset uniform in [0, max_position - its
    largest] (Cho et al.'s random start: the ids of longer instances are trained too)."""
    shift = int(rng.integers(0, max_position - max(instance.positions) + 1))
    return Instance(instance.size, instance.segments, tuple(p + shift for p in instance.positions))


def symbols(rng: np.random.Generator, alphabet: str, count: int) -> str:
    """``count`` characters drawn uniformly from ``alphabet``."""
    return "".join(np.asarray(list(alphabet))[rng.integers(0, len(alphabet), size=count)])


def unique_words(rng: np.random.Generator, alphabet: str, length: int, count: int) -> list[str]:
    """``count`` distinct words of ``length`` characters of ``alphabet``."""
    words: list[str] = []
    while len(words) < count:
        word = symbols(rng, alphabet, length)
        if word not in words:
            words.append(word)
    return words


def with_filler(rng: np.random.Generator, filler: np.ndarray | None, size: int, reserved: int,
                inserts: Sequence[str], name: str) -> list[Segment]:
    """``inserts`` in order at random depths of one contiguous filler passage, ``size - reserved`` tokens
    in all (``reserved``: the tokens of what follows, the question and its answer)."""
    if filler is None:
        raise ValueError(f"task {name} needs filler token ids (a corpus split), got None")
    amount = size - reserved - sum(len(text) for text in inserts)
    if amount < 0:
        raise ValueError(f"task {name}: size {size} leaves no room for its statements and question "
                         f"({size - amount} tokens)")
    if filler.size < amount:
        raise ValueError(f"task {name}: the filler has {filler.size} tokens, fewer than the {amount} needed")
    start = int(rng.integers(0, filler.size - amount + 1))
    passage = np.asarray(filler[start:start + amount], dtype=np.int64)
    cuts = np.sort(rng.integers(0, amount + 1, size=len(inserts)))
    segments, previous = [], 0
    for cut, text in zip(cuts, inserts, strict=True):
        segments += [Segment(passage[previous:cut]), Segment(text)]
        previous = int(cut)
    return [*segments, Segment(passage[previous:])]
