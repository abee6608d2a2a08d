"""A task of the suite (nanoattn/tasks) as token rows, for the trainer and the scorer.

Design choices:

- A row is ``<|endoftext|>`` + the instance + ``<|endoftext|>``. The first EOT is a start token
  every position can attend to; the last is scored with the answer, so an exact match also knows
  where the answer ends (greedy decoding would stop there).
- Task text is encoded a character at a time through a table read from the data's tokenizer:
  every character of the task's alphabet must be one token that decodes back to it, checked once
  (byte and byte-level BPE tokenizers have them all; a char tokenizer only the characters of its
  corpus). Never merged, the answer's tokens do not depend on their neighbours, and a task's text
  has one token per character. The suite's data is the byte tokenizer's (data=shakespeare_byte),
  so filler sizes are bytes too.
- Filler (the RULER tasks) is token ids of the data's train split for training and of its
  held-out val split for evaluation, so evaluation filler is text the model never saw.
- Rows are padded on the right with EOT inputs and ``IGNORE_INDEX`` targets: a causal model's
  outputs at real positions do not change, and padding costs no loss.
- An instance with position ids (position coupling) makes its batch (x, y, positions): the
  leading EOT and the padding at position 0, as Cho et al.'s BOS and padding. Training draws each
  instance's training form (``Task.for_training``: a random start of its ids or hints); the
  validation and evaluation instances are taken as drawn.
- Every instance comes from its own RNG seeded with a few integers (``draw``): training instance
  (seed, step, micro_step, row), validation and evaluation instances their own streams. So
  ``train_batch`` is a pure function of the step like ``TokenData.train_batch`` (exact resume),
  the global batch does not depend on the number of ranks, and any instance is re-derived from
  its seed words alone. The trainer's accuracy checks draw from a stream of their own, so a run
  stopped at an accuracy (``train.stop_at_accuracy``) is then scored on instances its stop never saw.
- Two training schedules keep that purity. A curriculum (``curriculum_steps``) caps the sizes
  drawn at a step by a function of the step alone. A fixed training set (``train_examples``: N)
  is N instances ``[POOL_STREAM, seed, i]``; each row picks its i from the row's own seed words,
  so rows draw the set with replacement, as random offsets into a finite data set do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from nanoattn.data.errors import DataError
from nanoattn.data.loader import TokenData
from nanoattn.model import IGNORE_INDEX
from nanoattn.tasks import Instance, Task

TRAIN_STREAM = 0x7461736B  # first word of every training instance's seed
VAL_STREAM = 0x7476616C  # validation instances (fixed, the same in every run)
EVAL_STREAM = 0x74657661  # the scorer's instances (nanoattn.eval.tasks)
CHECK_STREAM = 0x74636B61  # the trainer's accuracy checks: never the instances a report scores
POOL_STREAM = 0x74706F6C  # a fixed training set's instances (task.train_examples)


def row_inputs(task: Task, size: int) -> int:
    """Model inputs of the row of a ``task`` instance of ``size`` at most: its tokens + 2 EOT, less one."""
    return task.max_tokens(size) + 1


class TaskData:
    """Batches of ``task`` at training sizes up to ``train_length``, in the tokens of ``data``; with
    ``curriculum_steps`` the sizes grow to it, with ``train_examples`` rows come from a fixed set."""

    def __init__(self, data: TokenData, task: Task, train_length: int, *, curriculum_steps: int = 0,
                 train_examples: int | None = None) -> None:
        if train_length < task.min_size:
            raise ValueError(f"task.train_length={train_length} is invalid: must be at least "
                             f"{task.min_size}, the smallest {task.name} instance")
        self.data, self.task, self.train_length = data, task, train_length
        self.curriculum_steps, self.train_examples = curriculum_steps, train_examples
        self.table = _char_table(data, task)

    def __getattr__(self, name: str) -> Any:  # tokenizer, vocab_size, eot_id, bytes_per_token, ...
        return getattr(self.data, name)

    @property
    def seq_len(self) -> int:
        """Model inputs per row for the largest training instance."""
        return row_inputs(self.task, self.train_length)

    def check_seq_len(self, seq_len: int | None) -> int:
        """``seq_len``, or this task's own when None; an error when training instances would not fit."""
        if seq_len is None:
            return self.seq_len
        if seq_len < self.seq_len:
            raise ValueError(f"train.seq_len={seq_len} is invalid for task {self.task.name} at train_length="
                             f"{self.train_length}: its instances need {self.seq_len} (or null for that)")
        return seq_len

    def draw(self, words: Sequence[int], sizes: tuple[int, int], split: str, train: bool = False) -> Instance:
        """The instance seeded by ``words``: a size uniform in ``sizes``, filler from ``split``; with
        ``train``, its training form."""
        rng = np.random.default_rng(list(words))
        size = self.task.training_size(rng, *sizes) if train else int(rng.integers(sizes[0], sizes[1] + 1))
        filler = self.data.tokens(split) if self.task.uses_filler else None
        instance = self.task.instance(rng, size, filler)
        return self.task.for_training(instance, rng) if train else instance

    def encode(self, instance: Instance) -> tuple[np.ndarray, np.ndarray]:
        """(ids, scored): int64 token ids of the row (EOT, instance, EOT) and which ids are answer."""
        eot = self.data.eot_id
        ids, scored = [np.array([eot])], [np.array([False])]
        for segment in instance.segments:
            piece = segment.piece
            if isinstance(piece, str):
                part = self.table[np.frombuffer(piece.encode("ascii"), dtype=np.uint8)]
                if (part < 0).any():
                    raise ValueError(f"task {self.task.name} wrote {piece!r}, outside its alphabet "
                                     f"{self.task.alphabet!r}")
            else:
                part = np.asarray(piece, dtype=np.int64)
            ids.append(part)
            scored.append(np.full(part.size, segment.scored))
        ids.append(np.array([eot]))
        scored.append(np.array([True]))
        return np.concatenate(ids).astype(np.int64), np.concatenate(scored)

    def positions(self, instance: Instance, ids: np.ndarray) -> np.ndarray:
        """int64 positions of the row ``ids`` of ``instance``: its own position ids, both EOTs at 0."""
        if len(instance.positions) != ids.size - 2:
            raise ValueError(f"task {self.task.name} gave {len(instance.positions)} position ids to an "
                             f"instance of {ids.size - 2} tokens")
        return np.array([0, *instance.positions, 0], dtype=np.int64)

    def rows(self, instances: Sequence[Instance], width: int | None = None) -> tuple[torch.Tensor, ...]:
        """(x, y) int64 [len(instances), width]: inputs and answer-only targets, padded on the right;
        (x, y, positions) when the instances give position ids (padding at 0).

        ``width`` None: the longest row's inputs.
        """
        encoded = [self.encode(instance) for instance in instances]
        width = width or max(ids.size for ids, _ in encoded) - 1
        x = torch.full((len(instances), width), self.data.eot_id, dtype=torch.int64)
        y = torch.full((len(instances), width), IGNORE_INDEX, dtype=torch.int64)
        positioned = [instance.positions is not None for instance in instances]
        positions = torch.zeros((len(instances), width), dtype=torch.int64) if any(positioned) else None
        if any(positioned) and not all(positioned):
            raise ValueError(f"task {self.task.name} gave position ids to {sum(positioned)} of "
                             f"{len(instances)} instances of a batch: all or none")
        for row, (instance, (ids, scored)) in enumerate(zip(instances, encoded, strict=True)):
            if ids.size - 1 > width:
                raise ValueError(f"a {self.task.name} instance of size {instance.size} has {ids.size - 1} "
                                 f"inputs, more than the row's {width}")
            targets = np.where(scored[1:], ids[1:], IGNORE_INDEX)
            x[row, :ids.size - 1] = torch.from_numpy(ids[:-1])
            y[row, :ids.size - 1] = torch.from_numpy(targets)
            if positions is not None:
                positions[row, :ids.size - 1] = torch.from_numpy(self.positions(instance, ids)[:-1])
        return (x, y) if positions is None else (x, y, positions)

    def largest_size(self, step: int) -> int:
        """The largest size drawn at ``step``: ``train_length``, or under a curriculum the stage's, the
        sizes from min_size to train_length each given an equal share of ``curriculum_steps``."""
        if step >= self.curriculum_steps:
            return self.train_length
        stages = self.train_length - self.task.min_size + 1
        return self.task.min_size + stages * step // self.curriculum_steps

    def train_batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, micro_step: int = 0,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, ...]:
        """(x, y[, positions]) [batch_size, seq_len]: this rank's training instances for this step."""
        first = rank * batch_size
        words = [(TRAIN_STREAM, seed, step, micro_step, row) for row in range(first, first + batch_size)]
        if self.train_examples is not None:  # each row's pick of the fixed set
            words = [(POOL_STREAM, seed, int(np.random.default_rng(list(w)).integers(self.train_examples)))
                     for w in words]
        sizes = (self.task.min_size, self.largest_size(step))
        return self.rows([self.draw(w, sizes, "train", train=True) for w in words], seq_len)

    def val_batches(self, n_batches: int, *, batch_size: int,
                    seq_len: int) -> list[tuple[torch.Tensor, ...]]:
        """``n_batches`` fixed batches of instances at training sizes, filler from the held-out split."""
        sizes = (self.task.min_size, self.train_length)
        return [self.rows([self.draw((VAL_STREAM, b * batch_size + row), sizes, "val")
                           for row in range(batch_size)], seq_len) for b in range(n_batches)]


def _char_table(data: TokenData, task: Task) -> np.ndarray:
    """Token id per ASCII code of the task's alphabet (-1 elsewhere); an error for a character not a token."""
    table = np.full(128, -1, dtype=np.int64)
    for char in task.alphabet:
        ids = data.tokenizer.encode(char).ids
        if len(ids) != 1 or data.tokenizer.decode(ids) != char:
            raise DataError(f"task {task.name} needs every character of {task.alphabet!r} as one token; the "
                            f"tokenizer of {data.data_dir} makes {char!r} into {ids} (a byte "
                            "tokenizer has every character: data=shakespeare_byte)")
        table[ord(char)] = ids[0]
    return table
