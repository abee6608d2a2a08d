"""``scripts/eval_task.py``: a task run's accuracy by size, from its training length to 4x (docs/tasks.md).

``run_task_eval`` reads the task from the run's ``config.yaml``, scores the checkpoint
(``nanoattn.eval.tasks``) with filler from the held-out split and writes the report
(``<run dir>/task_eval[_<scaling>][_seed<k>][_step<N>].json``: every bin and every instance's seed, size and
result) and its figure; ``eval_task`` is the command: the same, then the table on stdout.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanoattn.checkpoint import RUN_CONFIG, read_run_config, resolve_checkpoint, run_directory
from nanoattn.config import TaskConfig
from nanoattn.data import TaskData
from nanoattn.eval.plots import plot_tasks
from nanoattn.eval.runs import ReportConfig, checkpoint_fields
from nanoattn.eval.tasks import (
    DEFAULT_FACTORS,
    DEFAULT_PER_BIN,
    check_bins_fit,
    check_factors,
    evaluate_task,
    task_table,
)
from nanoattn.validation import check_positive_int, check_seed, from_dict

REPORT_STEM = "task_eval"


@dataclass
class TaskEvalConfig(ReportConfig):
    """Every key of ``scripts/eval_task.py`` (the inherited ones: ``ReportConfig``)."""

    owner = "eval_task"
    report_stem = REPORT_STEM
    file_keys = {"seed": "seed"}  # another seed's report goes beside: <stem>_seed<k>.json

    batch_size: int = 64  # instances per forward pass
    factors: Sequence[float] = DEFAULT_FACTORS  # bins: sizes up to factor x the training length
    per_bin: int = DEFAULT_PER_BIN  # instances per bin (1,000: a 95% interval within +-3 points)
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.factors = check_factors(self.owner, self.factors)
        check_positive_int(self.owner, "per_bin", self.per_bin)
        check_seed(self.owner, "seed", self.seed)


def run_task(ckpt_path) -> TaskConfig:
    """The task a checkpoint's run trained on (its config.yaml); an error for a language-model run."""
    run = run_directory(resolve_checkpoint(ckpt_path))
    found = read_run_config(run, "task") if (run / RUN_CONFIG).is_file() else {}
    task = from_dict(TaskConfig, found, owner="task")
    if task.name is None:
        raise ValueError(f"eval_task.ckpt={str(ckpt_path)!r} is invalid: its run trained no task "
                         f"({run / RUN_CONFIG} has no task.name); train one with experiment=tasks "
                         "task=<name>")
    return task


def run_task_eval(cfg: TaskEvalConfig) -> dict[str, Any]:
    """Score ``cfg.ckpt`` on its task at every bin; write the JSON report (and figure). Returns the report."""
    task = run_task(cfg.ckpt)
    check_bins_fit(cfg.owner, task.build(), task.train_length, cfg.factors, cfg.per_bin, cfg.batch_size)
    checkpoint, data = cfg.load()
    task_data = TaskData(data, task.build(), task.train_length)
    began = time.perf_counter()
    bins = evaluate_task(checkpoint.model, task_data, factors=cfg.factors, per_bin=cfg.per_bin, seed=cfg.seed,
                         batch_size=cfg.batch_size, dtype=cfg.dtype)
    report = {
        **checkpoint_fields(checkpoint),
        "task": dataclasses.asdict(task),
        "per_bin": cfg.per_bin,
        "seed": cfg.seed,
        "rope_scaling": checkpoint.config.rope_scaling,
        "seconds": round(time.perf_counter() - began, 1),
        "results": bins,
    }
    cfg.save(report, plot_tasks)
    return report


def eval_task(cfg: TaskEvalConfig) -> dict[str, Any]:
    """The command: ``run_task_eval``, then the table and the files written."""
    report = run_task_eval(cfg)
    print(task_table([report], [cfg.label()]), end="")
    print(cfg.written())
    return report
