"""The task-family labs: the task lab, its two calibrations, the arithmetic lab and its control's budgets.

- Each is a ``Lab`` of the driver (``driver.py``) in ``TASK_LABS``, which the package's one
  registry ``LABS`` takes in beside the perplexity labs; the command functions that look a lab up
  there live with ``LABS``.
- The task lab's rows are every (task, encoding) pair it is given, read from the registries when it
  runs; its calibrations train those runs to the step they learn (``task_budget``, the task lab's
  step budget) and Lee et al. 2023's addition at their shape (``addition_calibration``). The
  arithmetic lab's rows are the methods its papers compare (``ARITHMETIC_ROWS``), each a run's
  overrides; its calibration ``control_budget`` trains its positive control, ``coupling_paper``, at
  growing shapes and budgets (``CONTROL_BUDGETS``).
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

from nanoattn.checkpoint import read_checkpoint_config, read_run_config
from nanoattn.commands.eval_task import TaskEvalConfig, run_task_eval
from nanoattn.commands.labs import papers
from nanoattn.commands.labs.driver import Lab, LabRunsConfig, Quick, Report, Row
from nanoattn.config import TaskConfig
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.data.tasks import row_inputs
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
# The arithmetic lab's rows over experiment=arithmetic (addition, every number least significant digit
# first): each the overrides of its runs. {longest} is the width of the longest row scored, the L of
# randomized positions. Position coupling's model is the paper's: a learned table read at the coupled ids
# and no other position ("NoPE" but for them), then RoPE rotating by them.
ARITHMETIC_ROWS: dict[str, tuple[str, ...]] = {
    "nope": ("pos=nope",),
    "rope": ("pos=rope",),
    "fire": ("pos=fire",),
    "abacus": ("pos=abacus",),
    "abacus_fire": ("pos=abacus_fire",),
    "abacus_rope": ("pos=abacus_rope",),
    "random_rope": ("pos=rope", "train.random_positions={longest}"),
    "coupling_ape": ("pos=learned", "task.position_coupling=true"),
    "coupling_rope": ("pos=rope", "task.position_coupling=true"),
    # The lab's positive control: position coupling in Cho et al.'s own setting, the format of their code
    # (operands most significant digit first, zero-padded; the sum reversed) and their 1-layer shape.
    "coupling_paper": ("pos=learned", "task.position_coupling=true", "task.zero_padded=true",
                       "task.reversed_operands=false", "model.n_layer=1"),
    "hints_nope": ("pos=nope", "task.index_hints=true"),
}
# The arithmetic lab's calibration (calibrate=control_budget): its positive control, coupling_paper, in the
# authors' 5 -> 10 digit block (task.max_position=17, 1 layer, 2 heads at d_model 512 in their script) at
# the shapes and budgets this CPU trains, each a cosine over its whole run; the authors report no accuracy
# for that block, and their smallest reported run is CHO_SMALLEST_RUN additions.
CONTROL_BUDGETS: dict[str, tuple[str, ...]] = {
    "d128_b128_3k": ("model.d_model=128", "model.n_head=2", "model.n_kv_head=2", "model.d_ff=512",
                     "train.batch_size=128", "train.max_steps=3000"),
    "d256_b256_3k": ("model.d_model=256", "model.n_head=2", "model.n_kv_head=2", "model.d_ff=1024",
                     "train.batch_size=256", "train.max_steps=3000"),
    "d128_b128_10k": ("model.d_model=128", "model.n_head=2", "model.n_kv_head=2", "model.d_ff=512",
                      "train.batch_size=128", "train.max_steps=10000", "train.decay_steps=null",
                      "train.eval_interval=1000"),
    "d128h4_b256_20k": ("model.d_model=128", "model.n_head=4", "model.n_kv_head=4", "model.d_ff=512",
                        "train.batch_size=256", "train.max_steps=20000", "train.decay_steps=null",
                        "train.eval_interval=2000"),
}
CONTROL_DIGITS = 5  # the authors' block trains on 1-5 digits
CHO_SMALLEST_RUN = 50_000 * 1_000  # 1 layer at d_model 1,024: 50k steps x 1,000 additions of 1-30 digits
ARITHMETIC_CALIBRATIONS = ("control_budget",)


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


@dataclass
class ArithmeticLabConfig(ScoredLabConfig):
    """Every key of ``scripts/arithmetic_lab.py``."""

    owner: ClassVar[str] = "arithmetic_lab"
    row_keys: ClassVar[tuple[str, ...]] = ("rows",)
    # control_budget: the positive control at each of CONTROL_BUDGETS instead of the lab's rows.
    calibrate: str | None = None
    digits: int = 5  # D: training operands have up to D digits (task.train_length); scored up to 4 D
    rows: list[str] = dataclasses.field(default_factory=lambda: list(ARITHMETIC_ROWS))  # of ARITHMETIC_ROWS

    def __post_init__(self) -> None:
        super().__post_init__()
        check_positive_int(self.owner, "digits", self.digits)
        self.check_names("rows", ARITHMETIC_ROWS)
        if self.calibrate is not None:
            check_choice(self.owner, "calibrate", self.calibrate, ARITHMETIC_CALIBRATIONS)
            if self.digits != CONTROL_DIGITS:
                fail(self.owner, "digits", self.digits,
                     f"calibrate={self.calibrate} trains the authors' block of {CONTROL_DIGITS} digits")
        for places in ({}, {"index_hints": True}):  # the widest rows: index hints double the digits
            task = TaskConfig(name="addition", train_length=self.digits, **places)
            check_bins_fit(self.owner, task.build(), self.digits, self.factors, self.per_bin,
                           self.batch_size)


def task_rows(cfg: TaskLabConfig) -> list[Row]:
    """Every (task, encoding) pair, then every (variant task, variant) pair."""
    def variant(name: str) -> str:
        return f"attention={name}" if name in ATTENTION_VARIANTS else f"pos={name}"

    return ([Row(f"{task}/{pos}", f"{task}/{pos}", (f"task={task}", f"pos={pos}"))
             for task in cfg.tasks for pos in cfg.encodings]
            + [Row(f"{task}/{name}", f"{task}/{name}", (f"task={task}", variant(name)))
               for task in cfg.variant_tasks for name in cfg.variants])


def arithmetic_rows(cfg: ArithmeticLabConfig) -> list[Row]:
    longest = row_inputs(TaskConfig(name="addition").build(), int(max(cfg.factors) * cfg.digits))
    return [Row(name, name, (*(o.format(longest=longest) for o in ARITHMETIC_ROWS[name]),
                             f"task.train_length={cfg.digits}")) for name in cfg.rows]


def control_budget_rows(cfg: ArithmeticLabConfig) -> list[Row]:
    return [Row(name, name, (*ARITHMETIC_ROWS["coupling_paper"], "task.max_position=17", *budget,
                             f"task.train_length={cfg.digits}"))
            for name, budget in CONTROL_BUDGETS.items()]


def control_budget_report(cfg: ArithmeticLabConfig, run: Path, row: Row) -> Report:
    """The arithmetic lab's report, with the additions the run trained on (steps x batch)."""
    report = task_report(cfg, run, row)
    return {**report, "additions": report["step"] * read_run_config(run, "train")["batch_size"]}


def control_budget_cells(report: Report) -> dict[str, float | None]:
    return {**task_cells(report), "additions": report["additions"]}


def control_budget_notes(values: Mapping[str, Mapping[str, Sequence[float | None]]]) -> list[str]:
    """The best row at 2x against the lab's bar, and the largest budget against the authors' smallest."""
    at_2x = {label: statistics.fmean(cells["exact 2x"]) for label, cells in values.items()
             if task_status(cells) is None and None not in cells.get("exact 2x", [None])}
    largest = max(max(cells["additions"]) for cells in values.values())
    line = (f"Cho et al.'s smallest reported run trained on {CHO_SMALLEST_RUN:,} additions, "
            f"{CHO_SMALLEST_RUN / largest:,.0f}x this page's largest ({largest:,.0f}).")
    if not at_2x:
        return ["No row learned addition at D digits.", line]
    best = max(at_2x, key=at_2x.get)
    verdict = "reaches" if at_2x[best] >= GENERALIZES else "stays below"
    return [f"**Best at 2D digits: {best}, exact match {at_2x[best]:.3f}**, which {verdict} the arithmetic "
            f"lab's bar of {GENERALIZES}.", line]


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


# What the arithmetic lab's page says when no row generalizes past 2D digits.
NOT_REPRODUCED = (
    "No row generalizes past 2D here, so the papers' headline results (Abacus: 20 digits trained, 100 "
    "solved; coupling: 30 trained, 200 solved) did not reproduce at this scale. Checked first: each "
    "method assigns the positions its paper does, written out by hand for \"123+45=\" "
    "(`tests/model/test_abacus.py`, `tests/tasks/test_places.py`); Abacus draws one offset per forward "
    "pass and none at evaluation, as the authors' module does, and matches the paper's formula "
    "(`references.md`); every row scored learned D digits (`exact 1x`). What differs from the papers: D "
    "(they train on 20-40 digits), the model (4 layers at d_model 128; McLeish et al.'s has 16), the "
    "budget (`configs/experiment/arithmetic.yaml`), and the operands of one instance, which have the same"
    " number of digits here where McLeish et al. train on every pair of operand lengths. The positive "
    "control at larger shapes and budgets: `control_budget.md`.")


def generalization_reach(cells: Mapping[str, Sequence[float | None]]) -> float:
    """The largest factor up to which a row's mean exact match holds GENERALIZES at every scored factor
    past 1x (1 if it does not at the first)."""
    bins = sorted((float(column[len("exact "):-1]), [v for v in values if v is not None])
                  for column, values in cells.items() if column.startswith("exact ") and column.endswith("x"))
    reach = 1.0
    for factor, scored in bins:
        if factor <= 1:
            continue
        if not scored or statistics.fmean(scored) < GENERALIZES:
            break
        reach = factor
    return reach


def arithmetic_notes(values: Mapping[str, Mapping[str, Sequence[float | None]]]) -> list[str]:
    """The lab's bar: does its best row hold GENERALIZES exact match past 2D digits; if not, what was
    checked before saying the papers' results did not reproduce at this scale."""
    learned = {label: generalization_reach(cells) for label, cells in values.items()
               if task_status(cells) is None}
    if not learned:
        return ["No row learned addition at D digits: no row is judged past it."]
    best = max(learned, key=learned.get)
    line = (f"**Best row: {best}, exact match at or above {GENERALIZES} up to {learned[best]:g}D digits** "
            f"(the bar: past 2D)." if learned[best] > 1 else
            f"**No row holds exact match {GENERALIZES} past D digits** (the bar: past 2D).")
    if learned[best] > 2:
        return [line]
    return [line, NOT_REPRODUCED]


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
    Lab("arithmetic", "Arithmetic: positions that make addition generalize",
        "Each row trains a small model on addition of operands up to D digits, every number written least "
        "significant digit first (`configs/experiment/arithmetic.yaml`), with one way of telling a digit's "
        "place (`ARITHMETIC_ROWS`), then scores exact match on fresh additions in size bins up to 4D digits. "
        f"A row whose exact match at 1x is below {LEARNED} did not learn addition at D digits and is not "
        "judged past it. The papers trained at 20-40 digits and tested at 100-200; here D is what the lab's "
        "CPU budget trains, so a finding says whether the direction holds at this scale.",
        arithmetic_rows, task_report, task_cells, plot_tasks, status=task_status, notes=arithmetic_notes,
        rates=exact_rates, claims=papers.ARITHMETIC,
        quick=Quick(("nope", "coupling_paper"), ("train.max_steps=600",), {"per_bin": 200})),
    Lab("control_budget", "The arithmetic lab's positive control at growing budgets",
        "Each row trains the arithmetic lab's positive control, `coupling_paper` (Cho et al. 2024's position "
        "coupling in the format and 1-layer shape of their code), on addition of up to 5 digits with "
        "`task.max_position=17`, as in the 5 -> 10 digit block of their scripts, at one shape and budget "
        "(`CONTROL_BUDGETS`: d_model, batch and steps in the row's name, a cosine over the whole run), "
        "then scores exact match as the arithmetic lab does; `additions` is steps x batch. The arithmetic "
        f"lab's bar is {GENERALIZES} exact match at 2D digits.",
        control_budget_rows, control_budget_report, control_budget_cells, plot_tasks, status=task_status,
        notes=control_budget_notes, rates=exact_rates, experiment="arithmetic",
        quick=Quick(("d128_b128_3k",), ("train.max_steps=600",), {"per_bin": 200})),
)
