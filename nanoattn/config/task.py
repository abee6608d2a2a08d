"""The ``task`` section of a run: a task of the suite to train on instead of corpus text, and the
options that say how its instances are drawn and written (docs/tasks.md).

Validated in ``__post_init__`` with one-line errors like every config; an option that only some tasks
read (``Task.options``) is refused for the others, by what each task declares, never by its name.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoattn.tasks import EVAL_FACTORS, TASKS, Task
from nanoattn.tasks.addition import HINTS
from nanoattn.validation import (
    check_bool,
    check_choice,
    check_non_negative_int,
    check_number,
    check_positive_int,
    fail,
)


@dataclass
class TaskConfig:
    """A task of the suite to train on instead of the corpus text (nanoattn/tasks, docs/tasks.md)."""

    name: str | None = None  # None: language modelling on data; else a task of nanoattn.tasks.TASKS
    # L: training instances have sizes drawn uniformly in [the task's min_size, L]; None: the task's own
    train_length: int | None = None
    # A curriculum: the largest size grows from min_size to L in equal stages over the first this many
    # steps; 0: every size from the first step; None: the task's own
    curriculum_steps: int | None = None
    # A fixed training set of this many instances seeded by train.seed (rows drawn with replacement)
    train_examples: int | None = None
    reversed_answer: bool = True  # addition: the sum written least significant digit first
    reversed_operands: bool = False  # addition: the operands too (McLeish et al.'s format, for Abacus)
    ignore_prob: float = 0.8  # flip_flop: share of ignore instructions (sparse 0.98, dense 0.1)
    # Cho et al. 2024 (addition, copy, reverse): tokens of one place share a position id, the model's
    # position for them; training starts the ids at a random offset keeping them <= max_position.
    position_coupling: bool = False
    max_position: int | None = None  # None: 4 x train_length + 2, every id of the default evaluation's sizes
    index_hints: bool = False  # addition (Zhou et al. 2023): each digit after a letter naming its place
    # addition, as Cho et al.'s code: each training operand's digits drawn on its own in [1, L] (else both
    # of one size), and the operands zero-padded to the longer's digits, the sum to one more
    independent_lengths: bool = False
    zero_padded: bool = False

    def __post_init__(self) -> None:
        own = "task"
        if self.name is not None:
            check_choice(own, "name", self.name, tuple(TASKS))
        if self.train_length is None:
            self.train_length = (Task if self.name is None else TASKS[self.name]).train_length
        check_positive_int(own, "train_length", self.train_length)
        if self.name is not None and self.train_length < TASKS[self.name].min_size:
            fail(own, "train_length", self.train_length,
                 f"must be at least {TASKS[self.name].min_size}, the smallest {self.name} instance")
        if self.curriculum_steps is None:
            self.curriculum_steps = (Task if self.name is None else TASKS[self.name]).curriculum_steps
        check_non_negative_int(own, "curriculum_steps", self.curriculum_steps)
        if self.train_examples is not None:
            check_positive_int(own, "train_examples", self.train_examples)
            if self.curriculum_steps:
                fail(own, "train_examples", self.train_examples,
                     f"must be null with task.curriculum_steps={self.curriculum_steps}: a fixed set has "
                     "its sizes from the start")
        for name in ("reversed_answer", "reversed_operands", "position_coupling", "index_hints",
                     "independent_lengths", "zero_padded"):
            check_bool(own, name, getattr(self, name))
        check_number(own, "ignore_prob", self.ignore_prob, "must be in [0, 1)", lambda x: 0 <= x < 1)
        self._check_places()

    def _check_places(self) -> None:
        """The options that mark a digit's place: only for the tasks that read them, one at a time."""
        own = "task"
        for name in ("reversed_operands", "position_coupling", "index_hints", "independent_lengths",
                     "zero_padded"):
            readers = [task for task, cls in TASKS.items() if name in cls.options]
            if getattr(self, name) and self.name not in readers:
                where = "and task.name is null" if self.name is None else f"not {self.name}"
                fail(own, name, True, f"applies to task {' | '.join(readers)}, {where}")
        if self.position_coupling and self.index_hints:
            fail(own, "index_hints", True, "must be false with position_coupling=true: two ways to mark "
                 "places, each its own paper's")
        if self.max_position is not None:
            check_positive_int(own, "max_position", self.max_position)
        elif self.position_coupling:
            self.max_position = int(max(EVAL_FACTORS) * self.train_length) + 2
        if self.position_coupling and self.max_position < self.train_length + 2:
            fail(own, "max_position", self.max_position, f"must be at least train_length + 2 = "
                 f"{self.train_length + 2}, the largest id of a training instance")
        if self.index_hints and self.train_length + 1 > len(HINTS):
            fail(own, "train_length", self.train_length, f"must be at most {len(HINTS) - 1} with "
                 f"index_hints: an instance of n digits takes n + 1 of the {len(HINTS)} hint letters")

    def build(self) -> Task:
        """The task generator ``name`` with the options it reads."""
        if self.name is None:
            raise ValueError("task.name=None is invalid here: name a task of the suite")
        cls = TASKS[self.name]
        return cls(**{option: getattr(self, option) for option in cls.options})
