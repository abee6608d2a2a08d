"""The labs, one registry: each a ``Lab`` of the driver (``driver.py``) with its rows and claims.

- The extrapolation and passkey labs take every ``pos`` option
  (``nanoattn.config.options.encoding_options``), the attention lab every ``ATTENTION_VARIANTS``
  entry, the task lab the tasks and encodings it is given: the rows are read from the registries
  when a lab runs, so a new encoding or variant is a row with no line here. The arithmetic lab's
  rows are the methods its papers compare (``ARITHMETIC_ROWS``), each a run's overrides.
- A lab is a script (``scripts/<name>_lab.py``: its config class and entry function below) and
  an entry of ``LABS``; its runs train with ``experiment=<name>``.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nanoattn.checkpoint import read_checkpoint_config
from nanoattn.commands.eval_length import LengthEvalConfig, run_length_eval
from nanoattn.commands.eval_passkey import PasskeyEvalConfig, run_passkey_eval
from nanoattn.commands.eval_task import TaskEvalConfig, run_task_eval
from nanoattn.commands.labs.driver import (
    Lab,
    LabRunsConfig,
    Report,
    Row,
    is_finished,
    largest_attention_logit,
    run_dir,
    run_lab,
    train_runs,
    training_speed,
)
from nanoattn.config import ModelConfig, TaskConfig
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.data.tasks import row_inputs
from nanoattn.eval.plots import plot_length_curves, plot_passkey, plot_tasks
from nanoattn.eval.results import Claim
from nanoattn.eval.runs import is_path, scaling_tag
from nanoattn.eval.tasks import DEFAULT_FACTORS, DEFAULT_PER_BIN, check_bins_fit, check_factors
from nanoattn.model import KVCache
from nanoattn.tasks import TASKS
from nanoattn.validation import check_bool, check_choice, check_positive_int, check_seed, fail

# Zero-shot RoPE scalings of the extrapolation lab: factor 4 for each type, and 16 (the longest
# length) for PI and YaRN, each evaluated on the RoPE runs.
LAB_SCALINGS = tuple({"type": kind, "factor": factor} for kind, factor in
                     (("linear", 4), ("linear", 16), ("ntk", 4), ("dynamic", 4), ("yarn", 4), ("yarn", 16)))
LAB_MULTIPLES = (1, 2, 4, 8, 16)  # perplexity labs: lengths as multiples of the training length
# The task lab's default set, the two papers it reproduces: Kazemnejad et al.'s encodings (NoPE, T5's
# bias, ALiBi, RoPE, an absolute one) and tasks (copy, reverse, addition), CoPE and its tasks
# (selective copy, counting, flip-flop).
TASK_LAB_TASKS = ("copy", "reverse", "addition", "selective_copy", "counting", "flip_flop")
TASK_LAB_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "t5", "cope")
LEARNED = 0.95  # task lab: exact match at 1x below which a row is "not learned", and not judged past it
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
    "hints_nope": ("pos=nope", "task.index_hints=true"),
}


@dataclass
class LabConfig(LabRunsConfig):
    """Every key of ``scripts/extrapolation_lab.py``."""

    owner: ClassVar[str] = "extrapolation_lab"
    passkey: bool = False  # the passkey lab (fine-tunes of the extrapolation runs), not perplexity
    samples: int = PasskeyEvalConfig.samples  # passkey lab: keys per length and depth
    init_root: str = "runs/extrapolation"  # passkey lab: the extrapolation lab's runs it fine-tunes

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool(self.owner, "passkey", self.passkey)
        check_positive_int(self.owner, "samples", self.samples)
        if not is_path(self.init_root):
            fail(self.owner, "init_root", self.init_root, "must be a folder")


@dataclass
class AttentionLabConfig(LabRunsConfig):
    """Every key of ``scripts/attention_lab.py``."""

    owner: ClassVar[str] = "attention_lab"


@dataclass
class TaskLabConfig(LabRunsConfig):
    """Every key of ``scripts/task_lab.py``."""

    owner: ClassVar[str] = "task_lab"
    # A calibration instead of the lab (CALIBRATIONS, docs/results/<name>.md): task_budget trains each
    # (task, encoding) run to the step it learns; addition_calibration is Lee et al. 2023's addition
    calibrate: str | None = None
    tasks: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_TASKS))  # of nanoattn.tasks
    encodings: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_ENCODINGS))  # pos options
    factors: list[float] = dataclasses.field(default_factory=lambda: list(DEFAULT_FACTORS))
    per_bin: int = DEFAULT_PER_BIN  # instances per size bin (400: a 95% interval within +-5 points)
    eval_seed: int = 0  # the evaluation instances' seed
    batch_size: int = 64  # instances per forward pass

    def __post_init__(self) -> None:
        super().__post_init__()
        own = self.owner
        if self.calibrate is not None:
            check_choice(own, "calibrate", self.calibrate, CALIBRATIONS)
        for name, allowed in (("tasks", tuple(TASKS)), ("encodings", tuple(encoding_options()))):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
                fail(own, name, value, "must be a non-empty list of names")
            setattr(self, name, list(value))
            for item in value:
                check_choice(own, name, item, allowed)
        self.factors = list(check_factors(own, self.factors))
        check_positive_int(own, "per_bin", self.per_bin)
        check_seed(own, "eval_seed", self.eval_seed)
        for name in self.tasks:  # at the task's own training length, as the lab trains it
            task = TaskConfig(name=name)
            check_bins_fit(own, task.build(), task.train_length, self.factors, self.per_bin, self.batch_size)


@dataclass
class ArithmeticLabConfig(LabRunsConfig):
    """Every key of ``scripts/arithmetic_lab.py``."""

    owner: ClassVar[str] = "arithmetic_lab"
    digits: int = 5  # D: training operands have up to D digits (task.train_length); scored up to 4 D
    rows: list[str] = dataclasses.field(default_factory=lambda: list(ARITHMETIC_ROWS))  # of ARITHMETIC_ROWS
    factors: list[float] = dataclasses.field(default_factory=lambda: list(DEFAULT_FACTORS))
    per_bin: int = DEFAULT_PER_BIN  # instances per size bin (400: a 95% interval within +-5 points)
    eval_seed: int = 0  # the evaluation instances' seed
    batch_size: int = 64  # instances per forward pass

    def __post_init__(self) -> None:
        super().__post_init__()
        own = self.owner
        check_positive_int(own, "digits", self.digits)
        if isinstance(self.rows, str) or not isinstance(self.rows, (list, tuple)) or not self.rows:
            fail(own, "rows", self.rows, "must be a non-empty list of names")
        self.rows = list(self.rows)
        for row in self.rows:
            check_choice(own, "rows", row, tuple(ARITHMETIC_ROWS))
        self.factors = list(check_factors(own, self.factors))
        check_positive_int(own, "per_bin", self.per_bin)
        check_seed(own, "eval_seed", self.eval_seed)
        for places in ({}, {"index_hints": True}):  # the widest rows: index hints double the digits
            task = TaskConfig(name="addition", train_length=self.digits, **places)
            check_bins_fit(own, task.build(), self.digits, self.factors, self.per_bin, self.batch_size)


def arithmetic_rows(cfg: ArithmeticLabConfig) -> list[Row]:
    longest = row_inputs(TaskConfig(name="addition").build(), int(max(cfg.factors) * cfg.digits))
    return [Row(name, name, (*(o.format(longest=longest) for o in ARITHMETIC_ROWS[name]),
                             f"task.train_length={cfg.digits}")) for name in cfg.rows]


def perplexity_report(cfg: LabRunsConfig, run: Path, row: Row) -> Report:
    report = run_length_eval(LengthEvalConfig(
        ckpt=str(run), max_tokens=cfg.max_tokens, mode="chunks", multiples=list(LAB_MULTIPLES),
        rope_scaling=None if row.scaling is None else dict(row.scaling), batch_size=cfg.batch_size,
        dtype=cfg.dtype, device=cfg.device))
    # The row's price: its run's training speed (a zero-shot scaling trains nothing).
    return report if row.scaling else {**report, "train_tok_per_s": training_speed(run)}


def perplexity_cells(report: Report) -> dict[str, float | None]:
    """Perplexity at each multiple of the training length (chunks, the ALiBi paper's protocol)."""
    length = report["train_seq_len"]
    cells = {f"ppl {r['length'] / length:g}x": r.get("ppl") for r in report["results"]}
    if "train_tok_per_s" in report:
        cells["train tok/s"] = report["train_tok_per_s"]
    return cells


def extrapolation_rows(cfg: LabConfig) -> list[Row]:
    encodings = [Row(name, name, (f"pos={name}",)) for name in encoding_options()]
    return encodings + [Row(f"rope+{scaling_tag(s)}", "rope", (), s) for s in LAB_SCALINGS]


def passkey_report(cfg: LabConfig, run: Path, row: Row) -> Report:
    return run_passkey_eval(PasskeyEvalConfig(ckpt=str(run), samples=cfg.samples, batch_size=cfg.batch_size,
                                              dtype=cfg.dtype, device=cfg.device))


def passkey_cells(report: Report) -> dict[str, float | None]:
    """Exact-match retrieval at each length, averaged over the key's depths (None: cannot run there)."""
    cells: dict[str, float | None] = {}
    for length in dict.fromkeys(c["length"] for c in report["results"]):
        scored = [c.get("accuracy") for c in report["results"] if c["length"] == length]
        cells[f"acc {length}"] = None if None in scored else statistics.fmean(scored)
    return cells


def attention_report(cfg: AttentionLabConfig, run: Path, row: Row) -> Report:
    report = perplexity_report(cfg, run, row)
    model = ModelConfig.from_dict(read_checkpoint_config(run)["model"])
    return {**report, "kv_bytes_per_token": KVCache(model, 1, 1, device="cpu").bytes_per_token(),
            "max_attn_logit": largest_attention_logit(run)}


def attention_cells(report: Report) -> dict[str, float | None]:
    return {**perplexity_cells(report), "KV bytes/token": report["kv_bytes_per_token"],
            "max logit": report["max_attn_logit"]}


def task_report(cfg: TaskLabConfig, run: Path, row: Row) -> Report:
    report = run_task_eval(TaskEvalConfig(ckpt=str(run), factors=cfg.factors, per_bin=cfg.per_bin,
                                          seed=cfg.eval_seed, batch_size=cfg.batch_size, dtype=cfg.dtype,
                                          device=cfg.device))
    return {**report, "train_tok_per_s": training_speed(run)}


def task_cells(report: Report) -> dict[str, float | None]:
    """Exact match at each size bin (up to factor x the training size), the step its training
    stopped at (its accuracy reached, or the budget spent) and the training speed."""
    return {**{f"exact {b['factor']:g}x": b.get("exact") for b in report["results"]},
            "steps": report["step"], "train tok/s": report["train_tok_per_s"]}


def calibration_report(cfg: TaskLabConfig, run: Path, row: Row) -> Report:
    """The step a calibration run stopped at, the exact match at 1x it measured there, its speed."""
    meta = read_checkpoint_config(run)
    return {"step": meta["step"], "exact_1x": meta.get("exact_1x"), "train_tok_per_s": training_speed(run)}


def calibration_cells(report: Report) -> dict[str, float | None]:
    return {"steps": report["step"], "exact 1x": report["exact_1x"], "train tok/s": report["train_tok_per_s"]}


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
    report = run_task_eval(TaskEvalConfig(ckpt=str(run), factors=DIGIT_FACTORS, per_bin=cfg.per_bin,
                                          seed=cfg.eval_seed, batch_size=cfg.batch_size, dtype=cfg.dtype,
                                          device=cfg.device))
    return {**report, "train_tok_per_s": training_speed(run)}


def addition_cells(report: Report) -> dict[str, float | None]:
    """Exact match with operands of 1, 2 and 3 digits, the steps trained and the training speed."""
    return {**{f"exact {b['sizes'][1]}-digit": b.get("exact") for b in report["results"]},
            "steps": report["step"], "train tok/s": report["train_tok_per_s"]}


def addition_notes(values: Mapping[str, Mapping[str, Sequence[float | None]]]) -> list[str]:
    return [f"**Lee et al. 2023: {LEE_2023_REVERSED:.2f}** exact match on 3-digit addition with the sum "
            "reversed, 10,000 training examples and 5,000 steps (their Section 4: the reversed format "
            "reaches full accuracy from a few thousand examples). The row above: `exact 3-digit` after "
            "`steps` steps."]


def task_status(cells: Mapping[str, Sequence[float | None]]) -> str | None:
    at_1x = [v for v in cells.get("exact 1x", ()) if v is not None]
    if at_1x and statistics.fmean(at_1x) >= LEARNED:
        return None
    return "not learned" + (f" ({statistics.fmean(at_1x):.2f} at 1x)" if at_1x else "")


ABOUT_PERPLEXITY = (
    "Each row is a model of the extrapolation experiment (`configs/experiment/extrapolation.yaml`: 4 layers, "
    "d_model 128, trained at 128 tokens) with one encoding, evaluated on the held-out plays in "
    "non-overlapping chunks at 1-16x the training length (the protocol of Press et al. 2022); "
    "`rope+<scaling>` rows evaluate the RoPE runs under a zero-shot RoPE scaling. `train tok/s` is the "
    "row's price, its run's median training speed.")

LABS: dict[str, Lab] = {lab.name: lab for lab in (
    Lab("extrapolation", "Length extrapolation: perplexity past the training length", ABOUT_PERPLEXITY,
        extrapolation_rows, perplexity_report, perplexity_cells, plot_length_curves, claims=(
            Claim("Press et al. 2022 (ALiBi)", "ALiBi's perplexity at 16x is below sinusoidal's", "ppl 16x",
                  "alibi", "sinusoidal"),
            Claim("Press et al. 2022 (ALiBi)", "ALiBi's perplexity at 16x is below RoPE's", "ppl 16x",
                  "alibi", "rope"),
            Claim("Chen et al. 2023 (PI)", "zero-shot PI (x4) at 4x is below plain RoPE at 4x", "ppl 4x",
                  "rope+linear4", "rope"),
            Claim("Peng et al. 2023 (YaRN)", "zero-shot YaRN (x4) at 4x is below zero-shot PI (x4)", "ppl 4x",
                  "rope+yarn4", "rope+linear4"),
        )),
    Lab("passkey", "Passkey retrieval past the training length",
        "Each row fine-tunes the extrapolation lab's run of one encoding on passkey retrieval at its "
        "training length (`configs/experiment/passkey.yaml`), then asks for the key at 1-16x that length, "
        "at several depths; a cell is the exact-match rate averaged over the depths.",
        lambda cfg: [Row(name, name, (f"pos={name}",)) for name in encoding_options()],
        passkey_report, passkey_cells, plot_passkey,
        train_extra=lambda cfg, row, seed: [
            f"train.init_from={run_dir(Path(cfg.init_root), row.run, seed)}"]),
    Lab("attention", "Attention variants: perplexity, price and logits",
        "Each row is the extrapolation experiment's model with RoPE and one attention variant "
        "(`nanoattn.config.options.ATTENTION_VARIANTS`, `configs/experiment/attention.yaml`), evaluated in "
        "chunks at 1-16x its training length; `train tok/s` is its run's median training speed, `KV "
        "bytes/token` what a decoded token adds to the cache, `max logit` the largest attention logit its "
        "evaluations saw during training.",
        lambda cfg: [Row(name, name, (f"attention={name}",)) for name in ATTENTION_VARIANTS],
        attention_report, attention_cells, plot_length_curves, claims=(
            Claim("Ye et al. 2024 (Differential Transformer)", "differential attention's perplexity at the "
                  "training length is below the plain block's", "ppl 1x", "diff", "plain"),
            Claim("Dehghani et al. 2023; OLMo 2 (QK-norm)", "QK-norm keeps the largest attention logit below "
                  "the plain block's", "max logit", "qk_norm", "plain"),
            Claim("Jiang et al. 2023 (Mistral)", "a sliding window keeps perplexity at 16x below the plain "
                  "block's", "ppl 16x", "window", "plain"),
        )),
    Lab("tasks", "Length generalization on tasks",
        "Each row trains a small model on one task at sizes up to its training size (`configs/experiment/"
        "tasks.yaml`) until it has learned the task (exact match at 1x of 0.95 on fresh instances) or spent "
        "the budget of its calibration (`task_budget.md`), `steps` saying where it stopped, then scores "
        "exact match on fresh instances in size bins up to 4x that size. A row whose exact match at 1x is "
        f"below {LEARNED} did not learn its task and is not judged past it.",
        lambda cfg: [Row(f"{task}/{pos}", f"{task}/{pos}", (f"task={task}", f"pos={pos}"))
                     for task in cfg.tasks for pos in cfg.encodings],
        task_report, task_cells, plot_tasks, status=task_status, claims=(
            Claim("Kazemnejad et al. 2023 (NoPE)", "NoPE generalizes better than RoPE on copy at 2x",
                  "exact 2x", "copy/nope", "copy/rope", lower_is_better=False),
            Claim("Kazemnejad et al. 2023 (NoPE)", "NoPE generalizes better than RoPE on reverse at 2x",
                  "exact 2x", "reverse/nope", "reverse/rope", lower_is_better=False),
            Claim("Golovneva et al. 2024 (CoPE)", "CoPE generalizes better than RoPE on counting at 2x",
                  "exact 2x", "counting/cope", "counting/rope", lower_is_better=False),
            Claim("Golovneva et al. 2024 (CoPE)", "CoPE generalizes better than RoPE on selective copy at 2x",
                  "exact 2x", "selective_copy/cope", "selective_copy/rope", lower_is_better=False),
        )),
    Lab("task_budget", "The task lab's step budget: steps to learn each task",
        "Each row trains the task lab's run of one task and encoding (`configs/experiment/tasks.yaml`) until "
        f"its exact match at 1x reaches `train.stop_at_accuracy` or step {CALIBRATION_STEPS:,}, and reports "
        "the step it stopped at. The rate is a cosine over `train.decay_steps`, then a tenth of its peak "
        "held, whatever the budget: a run that learns stops where the task lab's run of that task, "
        "encoding and seed stops. The budget below is the one the task lab trains with.",
        lambda cfg: [Row(f"{task}/{pos}", f"{task}/{pos}", (f"task={task}", f"pos={pos}"))
                     for task in cfg.tasks for pos in cfg.encodings],
        calibration_report, calibration_cells, None, status=calibration_status, notes=task_budget,
        experiment="tasks", train_extra=lambda cfg, row, seed: [f"train.max_steps={CALIBRATION_STEPS}"]),
    Lab("addition_calibration", "Calibration: 3-digit addition at Lee et al. 2023's shape",
        "One run of `configs/experiment/addition_calibration.yaml`: Lee et al. 2023's NanoGPT (6 layers, 6 "
        "heads, d_model 384, learned positions, dropout 0.2) on 3-digit addition with the sum reversed, "
        "10,000 training examples, batch 256, AdamW at 1e-3, for as many of their 5,000 steps as the "
        "command gave it (`steps`). Exact match is scored on fresh instances with operands of 1, 2 and 3 "
        "digits; the loss is on the answer only, theirs on every character.",
        lambda cfg: [Row("addition/learned", "addition/learned", ("task=addition", "pos=learned"))],
        addition_report, addition_cells, plot_tasks, notes=addition_notes),
    Lab("arithmetic", "Arithmetic: positions that make addition generalize",
        "Each row trains a small model on addition of operands up to D digits, every number written least "
        "significant digit first (`configs/experiment/arithmetic.yaml`), with one way of telling a digit's "
        "place (`ARITHMETIC_ROWS`), then scores exact match on fresh additions in size bins up to 4D digits. "
        f"A row whose exact match at 1x is below {LEARNED} did not learn addition at D digits and is not "
        "judged past it. The papers trained at 20-40 digits and tested at 100-200; here D is what the lab's "
        "CPU budget trains, so a finding says whether the direction holds at this scale.",
        arithmetic_rows, task_report, task_cells, plot_tasks, status=task_status, claims=(
            # Each claim: the paper's setting, then ours (D digits trained, 4 layers, 3,400 steps).
            Claim("McLeish et al. 2024 (Abacus)", "Abacus+FIRE beats FIRE at 4x (paper: trained on 20 "
                  "digits, near-perfect at 100; here D digits, scored at 4D)", "exact 4x", "abacus_fire",
                  "fire", lower_is_better=False),
            Claim("McLeish et al. 2024 (Abacus)", "Abacus beats NoPE at 2x (paper: Abacus alone against "
                  "NoPE, 20 digits trained)", "exact 2x", "abacus", "nope", lower_is_better=False),
            Claim("Cho et al. 2024 (position coupling)", "coupled ids beat NoPE at 4x (paper: a 1-layer "
                  "model, 30 digits trained, 200 tested; here 4 layers, D digits)", "exact 4x",
                  "coupling_ape", "nope", lower_is_better=False),
            Claim("Ruoss et al. 2023 (randomized positions)", "randomized RoPE beats RoPE at 2x (paper: "
                  "scored at random positions too; here at 0..T-1)", "exact 2x", "random_rope", "rope",
                  lower_is_better=False),
            Claim("Zhou et al. 2023 (index hints)", "index hints beat plain NoPE at 2x (paper: hints as "
                  "tokens of their own; here the letters a..Z)", "exact 2x", "hints_nope", "nope",
                  lower_is_better=False),
        )),
)}


def extrapolation_lab(cfg: LabConfig, trainer: Sequence[str]) -> dict[str, Any]:
    """The command: the perplexity lab, or with ``passkey`` the passkey lab."""
    return run_lab(LABS["passkey" if cfg.passkey else "extrapolation"], cfg, trainer)


def attention_lab(cfg: AttentionLabConfig, trainer: Sequence[str]) -> dict[str, Any]:
    return run_lab(LABS["attention"], cfg, trainer)


def task_lab(cfg: TaskLabConfig, trainer: Sequence[str]) -> dict[str, Any]:
    """The command: the task lab, or with ``calibrate`` one of its calibrations."""
    return run_lab(LABS[cfg.calibrate or "tasks"], cfg, trainer)


def arithmetic_lab(cfg: ArithmeticLabConfig, trainer: Sequence[str]) -> dict[str, Any]:
    return run_lab(LABS["arithmetic"], cfg, trainer)


__all__ = ["ARITHMETIC_ROWS", "LABS", "ArithmeticLabConfig", "AttentionLabConfig", "Lab", "LabConfig",
           "LabRunsConfig", "Row", "TaskLabConfig", "arithmetic_lab", "attention_lab", "extrapolation_lab",
           "is_finished", "run_lab", "task_lab", "train_runs"]
