"""The task lab and its two calibrations, and what every lab that scores tasks shares.

- Each is a ``Lab`` of the driver (``driver.py``) in ``TASK_LABS``, which the package's one
  registry ``LABS`` takes in beside the perplexity labs and the arithmetic labs (``arithmetic.py``);
  the command functions that look a lab up there live with ``LABS``.
- The task lab's rows are every (task, encoding) pair it is given, read from the registries when it
  runs; its calibrations train those runs to the step they learn (``task_budget``, the task lab's
  step budget) and Lee et al. 2023's addition at their shape (``addition_calibration``).
- All score exact match in size bins (``nanoattn.eval.tasks``), and a row that did not learn its
  task at 1x is shown as such and not judged past it.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from nanoattn.checkpoint import read_checkpoint_config
from nanoattn.commands.eval_task import TaskEvalConfig, run_task_eval
from nanoattn.commands.labs import papers
from nanoattn.commands.labs.driver import Lab, LabRunsConfig, Quick, Report, Row
from nanoattn.config import TaskConfig
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.eval.plots import plot_tasks
from nanoattn.eval.tasks import DEFAULT_FACTORS, DEFAULT_PER_BIN, check_bins_fit, check_factors
from nanoattn.tasks import TASKS
from nanoattn.validation import check_choice, check_positive_int, check_seed, fail

# The task lab's default set, the two papers it reproduces: Kazemnejad et al.'s encodings (NoPE, T5's
# bias, ALiBi, RoPE, an absolute one) and tasks (copy, reverse, addition), CoPE and its tasks
# (selective copy, counting, flip-flop).
TASK_LAB_TASKS = ("copy", "reverse", "addition", "selective_copy", "counting", "flip_flop")
TASK_LAB_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "t5", "cope")
# The newer attention that claims length generalization (FoX, stick-breaking: without positions; PoPE), each
# an attention variant or an encoding, on the tasks of CoPE's paper and copy: the rows <task>/<variant>.
TASK_LAB_VARIANTS = ("fox", "stick_breaking", "pope")
VARIANT_TASKS = ("copy", "selective_copy", "flip_flop", "counting")
LEARNED = 0.95  # task lab: exact match at 1x below which a row is "not learned", and not judged past it
GENERALIZES = 0.9  # arithmetic lab: the exact match a row must hold at a length to generalize to it
# The task budget calibration: each run trains until it learns (train.stop_at_accuracy) or this cap,
# and the task lab's budget (configs/experiment/tasks.yaml's train.max_steps) is BUDGET_FACTOR times
# the most steps a run that learned needed.
CALIBRATION_STEPS = 10_000
BUDGET_FACTOR = 2
CALIBRATIONS = ("task_budget", "addition_calibration")  # the task lab's calibrations, each a lab of LABS
# The addition calibration's bins: operands of exactly 1, 2 and 3 digits (factors of its 3 digits).
DIGIT_FACTORS = (1 / 3, 2 / 3, 1.0)
# Lee et al. 2023's reported exact match on 3-digit addition with the sum reversed and 10,000 examples.
LEE_2023_REVERSED = 1.0
@dataclass
class ScoredLabConfig(LabRunsConfig):
    """The keys of a lab that scores tasks by exact match in size bins."""

    factors: list[float] = dataclasses.field(default_factory=lambda: list(DEFAULT_FACTORS))
    per_bin: int = DEFAULT_PER_BIN  # instances per size bin (1,000: a 95% interval within +-3 points)
    eval_seed: int = 0  # the evaluation instances' seed
    batch_size: int = 64  # instances per forward pass

    def __post_init__(self) -> None:
        super().__post_init__()
        self.factors = list(check_factors(self.owner, self.factors))
        check_positive_int(self.owner, "per_bin", self.per_bin)
        check_seed(self.owner, "eval_seed", self.eval_seed)

    def check_names(self, name: str, allowed: Sequence[str]) -> None:
        """The list key ``name``: a non-empty list of ``allowed`` names, stored as a plain list."""
        value = getattr(self, name)
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            fail(self.owner, name, value, "must be a non-empty list of names")
        for item in value:
            check_choice(self.owner, name, item, tuple(allowed))
        setattr(self, name, list(value))


@dataclass
class TaskLabConfig(ScoredLabConfig):
    """Every key of ``scripts/task_lab.py``."""

    owner: ClassVar[str] = "task_lab"
    row_keys: ClassVar[tuple[str, ...]] = ("tasks", "encodings", "variants", "variant_tasks")
    # A calibration instead of the lab (CALIBRATIONS, docs/results/<name>.md): task_budget trains each
    # (task, encoding) run to the step it learns; addition_calibration is Lee et al. 2023's addition
    calibrate: str | None = None
    tasks: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_TASKS))  # of nanoattn.tasks
    encodings: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_ENCODINGS))  # pos options
    # Rows <task>/<variant> for each of variant_tasks: an attention variant (ATTENTION_VARIANTS) or a pos
    # option each; [] for none.
    variants: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_VARIANTS))
    variant_tasks: list[str] = dataclasses.field(default_factory=lambda: list(VARIANT_TASKS))  # of tasks

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.calibrate is not None:
            check_choice(self.owner, "calibrate", self.calibrate, CALIBRATIONS)
        self.check_names("tasks", TASKS)
        self.check_names("encodings", encoding_options())
        self.check_names("variant_tasks", TASKS)
        if self.variants != []:  # [] turns the variant rows off
            self.check_names("variants", (*ATTENTION_VARIANTS, *encoding_options()))
        labels = [row.label for row in task_rows(self)]
        repeated = next((label for label in labels if labels.count(label) > 1), None)
        if repeated is not None:
            fail(self.owner, "variants", self.variants, f"must not repeat a row: {repeated} twice")
        for name in dict.fromkeys((*self.tasks, *(self.variant_tasks if self.variants else ()))):
            task = TaskConfig(name=name)
            check_bins_fit(self.owner, task.build(), task.train_length, self.factors, self.per_bin,
                           self.batch_size)


def task_rows(cfg: TaskLabConfig) -> list[Row]:
    """Every (task, encoding) pair, then every (variant task, variant) pair."""
    def variant(name: str) -> str:
        return f"attention={name}" if name in ATTENTION_VARIANTS else f"pos={name}"

    return ([Row(f"{task}/{pos}", f"{task}/{pos}", (f"task={task}", f"pos={pos}"))
             for task in cfg.tasks for pos in cfg.encodings]
            + [Row(f"{task}/{name}", f"{task}/{name}", (f"task={task}", variant(name)))
               for task in cfg.variant_tasks for name in cfg.variants])


def task_report(cfg: TaskLabConfig, run: Path, row: Row) -> Report:
    return run_task_eval(TaskEvalConfig(ckpt=str(run), factors=cfg.factors, per_bin=cfg.per_bin,
                                        seed=cfg.eval_seed, batch_size=cfg.batch_size, dtype=cfg.dtype,
                                        device=cfg.device))


def task_cells(report: Report) -> dict[str, float | None]:
    """Exact match at each size bin (up to factor x the training size), the step its training
    stopped at (its accuracy reached, or the budget spent)."""
    return {**{f"exact {b['factor']:g}x": b.get("exact") for b in report["results"]}, "steps": report["step"]}


def calibration_report(cfg: TaskLabConfig, run: Path, row: Row) -> Report:
    """The step a calibration run stopped at and the exact match at 1x it measured there."""
    meta = read_checkpoint_config(run)
    return {"step": meta["step"], "exact_1x": meta.get("exact_1x")}


def calibration_cells(report: Report) -> dict[str, float | None]:
    return {"steps": report["step"], "exact 1x": report["exact_1x"]}


def learned_in_every_seed(cells: Mapping[str, Sequence[float | None]]) -> bool:
    at_1x = cells.get("exact 1x", ())
    return bool(at_1x) and None not in at_1x and min(at_1x) >= LEARNED


def calibration_status(cells: Mapping[str, Sequence[float | None]]) -> str | None:
    if learned_in_every_seed(cells):
        return None
    steps = max((v for v in cells.get("steps", ()) if v is not None), default=None)
    at_1x = [v for v in cells.get("exact 1x", ()) if v is not None]
    return (f"not learned in {steps:,.0f} steps" if steps is not None else "not learned") + (
        f" ({statistics.fmean(at_1x):.2f} at 1x)" if at_1x else "")


def task_budget(values: Mapping[str, Mapping[str, Sequence[float | None]]]) -> list[str]:
    """The budget line: BUDGET_FACTOR times the most steps a row that learned needed."""
    needed = {label: max(cells["steps"]) for label, cells in values.items() if learned_in_every_seed(cells)}
    if not needed:
        return ["No row learned its task: no budget follows."]
    slowest = max(needed, key=needed.get)
    return [f"**Budget: {BUDGET_FACTOR} × {needed[slowest]:,.0f} steps ({slowest}, the slowest to learn) = "
            f"{BUDGET_FACTOR * needed[slowest]:,.0f} steps**, the task lab's `train.max_steps` "
            "(`configs/experiment/tasks.yaml`)."]


def addition_report(cfg: TaskLabConfig, run: Path, row: Row) -> Report:
    return run_task_eval(TaskEvalConfig(ckpt=str(run), factors=DIGIT_FACTORS, per_bin=cfg.per_bin,
                                        seed=cfg.eval_seed, batch_size=cfg.batch_size, dtype=cfg.dtype,
                                        device=cfg.device))


def addition_cells(report: Report) -> dict[str, float | None]:
    """Exact match with operands of 1, 2 and 3 digits, and the steps trained."""
    return {**{f"exact {b['sizes'][1]}-digit": b.get("exact") for b in report["results"]},
            "steps": report["step"]}


def addition_notes(values: Mapping[str, Mapping[str, Sequence[float | None]]]) -> list[str]:
    return [f"**Lee et al. 2023: {LEE_2023_REVERSED:.2f}** exact match on 3-digit addition with the sum "
            "reversed, 10,000 training examples and 5,000 steps (their Section 4: the reversed format "
            "reaches full accuracy from a few thousand examples). The row above: `exact 3-digit` after "
            "`steps` steps."]


def exact_rates(cfg: ScoredLabConfig, column: str) -> int | None:
    """Instances behind an exact-match cell: the lab's ``per_bin``."""
    return cfg.per_bin if column.startswith("exact ") else None


def task_status(cells: Mapping[str, Sequence[float | None]]) -> str | None:
    at_1x = [v for v in cells.get("exact 1x", ()) if v is not None]
    if at_1x and statistics.fmean(at_1x) >= LEARNED:
        return None
    return "not learned" + (f" ({statistics.fmean(at_1x):.2f} at 1x)" if at_1x else "")


# The quick form of the task lab and its budget: the task both encodings learn in the fewest steps.
QUICK_TASKS = Quick(("flip_flop/nope", "flip_flop/rope"), ("train.max_steps=400",), {"per_bin": 200})

TASK_LABS: tuple[Lab, ...] = (
    Lab("tasks", "Length generalization on tasks",
        "Each row trains a small model on one task at sizes up to its training size (`configs/experiment/"
        "tasks.yaml`) until it has learned the task (exact match at 1x reaching `train.stop_at_accuracy` on "
        f"its check instances, above the judging bar of {LEARNED}) or spent the budget of its calibration "
        "(`task_budget.md`), `steps` saying where it stopped, then scores "
        "exact match on fresh instances in size bins up to 4x that size. A row whose exact match at 1x is "
        f"below {LEARNED} did not learn its task and is not judged past it. The rows of `variants` (FoX and "
        "stick-breaking without positions, PoPE) run on `variant_tasks` only.",
        task_rows, task_report, task_cells, plot_tasks, status=task_status, rates=exact_rates,
        claims=papers.TASKS, quick=QUICK_TASKS),
    Lab("task_budget", "The task lab's step budget: steps to learn each task",
        "Each row trains the task lab's run of one task and encoding (`configs/experiment/tasks.yaml`) until "
        f"its exact match at 1x reaches `train.stop_at_accuracy` or step {CALIBRATION_STEPS:,}, and reports "
        "the step it stopped at. The rate is a cosine over `train.decay_steps`, then a tenth of its peak "
        "held, whatever the budget: a run that learns stops where the task lab's run of that task, "
        "encoding and seed stops. The budget below is the one the task lab trains with.",
        lambda cfg: [Row(f"{task}/{pos}", f"{task}/{pos}", (f"task={task}", f"pos={pos}"))
                     for task in cfg.tasks for pos in cfg.encodings],
        calibration_report, calibration_cells, None, status=calibration_status, notes=task_budget,
        rates=lambda cfg, column: DEFAULT_PER_BIN if column == "exact 1x" else None,
        experiment="tasks", train_extra=lambda cfg, row, seed: [f"train.max_steps={CALIBRATION_STEPS}"],
        quick=QUICK_TASKS),
    Lab("addition_calibration", "Calibration: 3-digit addition at Lee et al. 2023's shape",
        "One run of `configs/experiment/addition_calibration.yaml`: Lee et al. 2023's NanoGPT (6 layers, 6 "
        "heads, d_model 384, learned positions, dropout 0.2) on 3-digit addition with the sum reversed, "
        "10,000 training examples, batch 256, AdamW at 1e-3, for as many of their 5,000 steps as the "
        "command gave it (`steps`). Exact match is scored on fresh instances with operands of 1, 2 and 3 "
        "digits; the loss is on the answer only, theirs on every character.",
        lambda cfg: [Row("addition/learned", "addition/learned", ("task=addition", "pos=learned"))],
        addition_report, addition_cells, plot_tasks, notes=addition_notes, rates=exact_rates,
        quick=Quick(("addition/learned",), ("train.max_steps=30",), {"per_bin": 200})),
)
