"""The labs, one driver: ``scripts/extrapolation_lab.py``, ``attention_lab.py`` and ``task_lab.py``.

Design choices:

- A lab is a list of jobs (a label, the encoding whose run ``<runs_root>/<pos>`` it evaluates,
  an optional zero-shot RoPE scaling), one evaluation command's report function, a figure and a
  table over all reports. ``run_lab`` runs that shape for both labs: it checks every run exists
  before evaluating any, evaluates each (its JSON and figure land in its run directory, as
  ``eval_length``/``eval_passkey`` write them), then writes ``<out_dir>/<lab>.png`` and the table
  between the ``<lab>-table`` markers of ``<out_dir>/extrapolation.md``.
- The perplexity lab evaluates each encoding in non-overlapping chunks (the protocol of Press et
  al. 2022, whose result it reproduces), then the RoPE run again under each of ``LAB_SCALINGS``.
  The passkey lab evaluates each encoding's passkey fine-tune; its table averages the depths.
- The attention lab trains the same tiny model with RoPE once per attention variant
  (``configs/attention/<name>.yaml``, a Hydra group like ``pos``) and evaluates each in chunks
  at 1-16x; its table adds each run's KV cache per token (``KVCache.bytes_per_token``).
- The task lab trains ``runs/tasks/<task>/<encoding>`` for every pair of ``tasks`` and
  ``encodings`` (``experiment=tasks``), scores each with ``eval_task`` at the size bins and writes
  the figure, the table (docs/tasks.md) and a summary of every bin with its seed (docs/tasks.json).
  ``train_runs`` takes each job's own overrides, so one driver trains every lab's grid.
- Defaults are the evaluation commands' own (``LengthEvalConfig``, ``PasskeyEvalConfig``), read
  from their dataclasses rather than stated again.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nanoattn.checkpoint import read_checkpoint_config
from nanoattn.commands.eval_length import LengthEvalConfig, run_length_eval
from nanoattn.commands.eval_passkey import PasskeyEvalConfig, run_passkey_eval
from nanoattn.commands.eval_task import TaskEvalConfig, run_task_eval
from nanoattn.config import ModelConfig
from nanoattn.eval.compare import length_table
from nanoattn.eval.passkey import passkey_summary_table
from nanoattn.eval.plots import plot_length_curves, plot_passkey, plot_tasks
from nanoattn.eval.runs import is_path, scaling_tag, write_report
from nanoattn.eval.tables import write_table
from nanoattn.eval.tasks import DEFAULT_FACTORS, DEFAULT_PER_BIN, check_factors, task_table
from nanoattn.logging import read_metrics
from nanoattn.model import KVCache
from nanoattn.runtime import DTYPES, check_device_name
from nanoattn.tasks import TASKS
from nanoattn.validation import check_bool, check_choice, check_non_negative_int, check_positive_int, fail

# The lab's rows: configs/pos/<name>.yaml each (a registry encoding, or a variant such as
# partial RoPE or Llama 4's iRoPE layout); runs land in <runs_root>/<name>.
LAB_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "nope", "t5", "kerple_log", "kerple_power", "fire",
                 "rope_partial", "p_rope", "xpos", "irope", "cope")
# Zero-shot RoPE scalings of the lab: factor 4 for each type, and 16 (the longest length) for PI and YaRN.
LAB_SCALINGS = tuple({"type": kind, "factor": factor} for kind, factor in
                     (("linear", 4), ("linear", 16), ("ntk", 4), ("dynamic", 4), ("yarn", 4), ("yarn", 16)))
LAB_DOC = "extrapolation.md"  # both labs' tables, between their markers
# The attention lab's rows: configs/attention/<name>.yaml each; runs land in runs/attention/<name>.
ATTENTION_VARIANTS = ("plain", "qk_norm", "qk_norm_after", "softcap", "sinks", "window", "local_global",
                      "diff", "mla", "value_embeds", "token_shift")
ATTENTION_DOC = "attention.md"

# The task lab's default set, the two papers it reproduces: Kazemnejad et al.'s encodings (NoPE, T5's
# bias, ALiBi, RoPE, an absolute one) and tasks (copy, reverse, addition), CoPE and its tasks
# (selective copy, counting, flip-flop). It fits the 45-minute budget on 2 cores; parity and the
# RULER tasks are one tasks=[...] away. Runs land in runs/tasks/<task>/<pos>.
TASK_LAB_TASKS = ("copy", "reverse", "addition", "selective_copy", "counting", "flip_flop")
TASK_LAB_ENCODINGS = ("nope", "sinusoidal", "rope", "alibi", "t5", "cope")
TASK_DOC = "tasks.md"
POS_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "pos"  # a lab encoding is one of these files

Job = tuple[str, str, Mapping[str, Any] | None]  # (label, pos: the run <runs_root>/<pos>, zero-shot scaling)
Reports = Sequence[Mapping[str, Any]]


@dataclass
class LabRunsConfig:
    """The keys every lab has: where its runs are, how to train them, how to evaluate them."""

    owner: ClassVar[str]
    runs_root: str | None = None  # where the runs are; None: runs/<lab>
    out_dir: str = "docs"  # <out_dir>/<lab>.png and the table in <out_dir>/<the lab's page>
    max_tokens: int = LengthEvalConfig.max_tokens  # perplexity labs: targets scored at every length
    batch_size: int = LengthEvalConfig.batch_size
    dtype: str = LengthEvalConfig.dtype
    device: str = LengthEvalConfig.device
    train: bool = False  # first train (or finish) every run the lab evaluates, `workers` at a time
    workers: int = 2  # trainings at once with train=true; each gets cpu_count // workers threads
    train_overrides: list[str] = dataclasses.field(default_factory=list)  # e.g. [train.max_steps=500]

    def __post_init__(self) -> None:
        own = self.owner
        check_bool(own, "train", self.train)
        check_positive_int(own, "workers", self.workers)
        if not isinstance(self.train_overrides, (list, tuple)) or not all(
                isinstance(o, str) and "=" in o for o in self.train_overrides):
            fail(own, "train_overrides", self.train_overrides, "must be a list of key=value overrides")
        if self.runs_root is not None and not is_path(self.runs_root):
            fail(own, "runs_root", self.runs_root, "must be a folder or null")
        if not is_path(self.out_dir):
            fail(own, "out_dir", self.out_dir, "must be a folder")
        for name in ("max_tokens", "batch_size"):
            check_positive_int(own, name, getattr(self, name))
        check_choice(own, "dtype", self.dtype, DTYPES)
        check_device_name(own, "device", self.device)


@dataclass
class LabConfig(LabRunsConfig):
    """Every key of ``scripts/extrapolation_lab.py``."""

    owner: ClassVar[str] = "extrapolation_lab"
    passkey: bool = False  # the passkey lab (runs/passkey/<pos>), not perplexity (runs/extrapolation/<pos>)
    samples: int = PasskeyEvalConfig.samples  # passkey lab: keys per length and depth

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool(self.owner, "passkey", self.passkey)
        check_positive_int(self.owner, "samples", self.samples)

    @property
    def lab(self) -> str:
        return "passkey" if self.passkey else "extrapolation"


@dataclass
class AttentionLabConfig(LabRunsConfig):
    """Every key of ``scripts/attention_lab.py``."""

    owner: ClassVar[str] = "attention_lab"


@dataclass
class TaskLabConfig(LabRunsConfig):
    """Every key of ``scripts/task_lab.py``."""

    owner: ClassVar[str] = "task_lab"
    tasks: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_TASKS))  # of nanoattn.tasks
    encodings: list[str] = dataclasses.field(default_factory=lambda: list(TASK_LAB_ENCODINGS))  # configs/pos/
    factors: list[float] = dataclasses.field(default_factory=lambda: list(DEFAULT_FACTORS))
    per_bin: int = DEFAULT_PER_BIN  # instances per size bin (400: a 95% interval within +-5 points)
    seed: int = 0  # the evaluation instances' seed
    batch_size: int = 64  # instances per forward pass

    def __post_init__(self) -> None:
        super().__post_init__()
        own = self.owner
        for name in ("tasks", "encodings"):
            value = getattr(self, name)
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
                fail(own, name, value, "must be a non-empty list of names")
            setattr(self, name, list(value))
        for task in self.tasks:
            check_choice(own, "tasks", task, tuple(TASKS))
        for pos in self.encodings:
            if not (POS_CONFIGS / f"{pos}.yaml").is_file():
                known = sorted(p.stem for p in POS_CONFIGS.glob("*.yaml"))
                fail(own, "encodings", pos, f"needs configs/pos/{pos}.yaml; allowed: {' | '.join(known)}")
        self.factors = list(check_factors(own, self.factors))
        check_positive_int(own, "per_bin", self.per_bin)
        check_non_negative_int(own, "seed", self.seed)


def train_runs(lab: str, runs_root: Path, jobs: Mapping[str, Sequence[str]], workers: int,
               overrides: Sequence[str]) -> None:
    """Train ``<runs_root>/<name>`` for each job with ``scripts/train.py experiment=<lab> <its overrides>``
    (which choose the run and its directory), ``workers`` processes at a time, each on
    cpu_count // workers threads (small models use cores better side by side than one model on
    all of them). A run already there is resumed, so a finished one ends at once and a killed lab
    continues. Each run's output goes to ``<runs_root>/<name>.log``; a failed run is named with its
    log once the others are done.
    """
    script = Path(__file__).resolve().parents[2] / "scripts" / "train.py"
    if not script.is_file():
        raise ValueError(f"train=true needs the repository's {script} (an editable install of nanoattn)")
    runs_root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}
    pending, running, failed = list(jobs), {}, []
    while pending or running:
        while pending and len(running) < workers:
            name = pending.pop(0)
            resume = ["train.resume=true"] if (runs_root / name / "config.yaml").exists() else []
            command = [sys.executable, str(script), f"experiment={lab}", *jobs[name], "logger=none", *resume,
                       *overrides]
            (runs_root / name).parent.mkdir(parents=True, exist_ok=True)
            log = (runs_root / f"{name}.log").open("w")
            running[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env),
                             log, time.perf_counter())
        time.sleep(1.0)
        for name, (process, log, began) in list(running.items()):
            if process.poll() is not None:
                log.close()
                del running[name]
                print(f"{name}: trained in {time.perf_counter() - began:.0f} s (exit {process.returncode})")
                if process.returncode:
                    failed.append(name)
    if failed:
        raise ValueError(f"training failed for {', '.join(failed)}: see {runs_root}/<name>.log")


def largest_attention_logit(run: Path) -> float | None:
    """The largest ``max_attn_logit`` a run logged at its evaluations (metrics.jsonl), None if none."""
    logits = [r["max_attn_logit"] for r in read_metrics(run / "metrics.jsonl") if "max_attn_logit" in r]
    return max(logits) if logits else None


def training_speed(run: Path) -> float | None:
    """Median training tokens/s of a run's logged intervals (metrics.jsonl), None if it logged none."""
    speeds = [r["tok_per_s"] for r in read_metrics(run / "metrics.jsonl") if "tok_per_s" in r]
    return statistics.median(speeds) if speeds else None


def run_lab(lab: str, runs_root: Path, out_dir: Path, jobs: Sequence[Job],
            evaluate: Callable[[Path, Mapping[str, Any] | None], dict[str, Any]],
            plot: Callable[[Reports, Sequence[str], Path], Path],
            table: Callable[[Reports, Sequence[str]], str], *,
            doc: str = LAB_DOC) -> tuple[str, list[dict[str, Any]]]:
    """Evaluate every job, then write ``<out_dir>/<lab>.png`` and the table (in ``<out_dir>/<doc>``);
    returns the table and the reports."""
    missing = sorted({pos for _, pos, _ in jobs if not (runs_root / pos).is_dir()})
    if missing:
        raise ValueError(f"no run directory for {', '.join(missing)} under {runs_root}; run the lab with "
                         "train=true to train them")
    labels, reports = [], []
    for label, pos, scaling in jobs:
        began = time.perf_counter()
        reports.append(evaluate(runs_root / pos, scaling))
        labels.append(label)
        print(f"{label}: evaluated in {time.perf_counter() - began:.1f} s")
    out_dir.mkdir(parents=True, exist_ok=True)
    plot(reports, labels, out_dir / f"{lab}.png")
    text = table(reports, labels)
    write_table(out_dir / doc, text, name=f"{lab}-table")
    return text, reports


def extrapolation_lab(cfg: LabConfig) -> str:
    """The command: run the perplexity lab (or, with ``passkey``, the passkey lab); print its table."""
    began = time.perf_counter()
    runs_root = Path(cfg.runs_root or f"runs/{cfg.lab}")
    out_dir = Path(cfg.out_dir)
    common = dict(batch_size=cfg.batch_size, dtype=cfg.dtype, device=cfg.device)
    if cfg.train:
        train_runs(cfg.lab, runs_root, {pos: [f"pos={pos}", f"out_dir={runs_root}"] for pos in LAB_ENCODINGS},
                   cfg.workers, cfg.train_overrides)
    plain: list[Job] = [(pos, pos, None) for pos in LAB_ENCODINGS]
    if cfg.passkey:
        table, _ = run_lab(cfg.lab, runs_root, out_dir, plain,
                        lambda run, _: run_passkey_eval(PasskeyEvalConfig(ckpt=str(run), samples=cfg.samples,
                                                                          **common)),
                        plot_passkey, passkey_summary_table)
    else:
        scaled: list[Job] = [(f"rope+{scaling_tag(s)}", "rope", s) for s in LAB_SCALINGS]

        def evaluate(run: Path, scaling: Mapping[str, Any] | None) -> dict[str, Any]:
            report = run_length_eval(LengthEvalConfig(
                ckpt=str(run), max_tokens=cfg.max_tokens, mode="chunks",
                rope_scaling=None if scaling is None else dict(scaling), **common))
            # The encoding's price: its run's training speed (a zero-shot scaling trains nothing).
            return report if scaling else {**report, "train_tok_per_s": training_speed(run)}

        table, _ = run_lab(cfg.lab, runs_root, out_dir, plain + scaled, evaluate, plot_length_curves,
                        length_table)
    print(table, end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {out_dir / LAB_DOC} and "
          f"{out_dir / cfg.lab}.png")
    return table


def attention_lab(cfg: AttentionLabConfig) -> str:
    """The command: train (with ``train``) and evaluate every attention variant; print its table."""
    began = time.perf_counter()
    runs_root, out_dir = Path(cfg.runs_root or "runs/attention"), Path(cfg.out_dir)
    if cfg.train:
        train_runs("attention", runs_root, {name: [f"attention={name}", f"out_dir={runs_root}"]
                                            for name in ATTENTION_VARIANTS}, cfg.workers, cfg.train_overrides)

    def evaluate(run: Path, _: Mapping[str, Any] | None) -> dict[str, Any]:
        report = run_length_eval(LengthEvalConfig(ckpt=str(run), max_tokens=cfg.max_tokens, mode="chunks",
                                                  batch_size=cfg.batch_size, dtype=cfg.dtype,
                                                  device=cfg.device))
        # The variant's prices, its training speed and the KV cache a decoded token adds, and the
        # largest attention logit its evaluations saw during training.
        model = ModelConfig.from_dict(read_checkpoint_config(run)["model"])
        return {**report, "train_tok_per_s": training_speed(run),
                "kv_bytes_per_token": KVCache(model, 1, 1, device="cpu").bytes_per_token(),
                "max_attn_logit": largest_attention_logit(run)}

    jobs: list[Job] = [(name, name, None) for name in ATTENTION_VARIANTS]
    table, _ = run_lab("attention", runs_root, out_dir, jobs, evaluate, plot_length_curves, length_table,
                    doc=ATTENTION_DOC)
    print(table, end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {out_dir / ATTENTION_DOC} and "
          f"{out_dir / 'attention.png'}")
    return table


def task_lab(cfg: TaskLabConfig) -> str:
    """The command: train (with ``train``) every (task, encoding) run, score each at 1-4x its training
    size, write docs/tasks.{png,md} and a summary JSON (docs/tasks.json); print the table."""
    began = time.perf_counter()
    runs_root, out_dir = Path(cfg.runs_root or "runs/tasks"), Path(cfg.out_dir)
    if cfg.train:
        jobs = {f"{task}/{pos}": [f"task={task}", f"pos={pos}", f"out_dir={runs_root / task}"]
                for task in cfg.tasks for pos in cfg.encodings}
        train_runs("tasks", runs_root, jobs, cfg.workers, cfg.train_overrides)

    def evaluate(run: Path, _: Mapping[str, Any] | None) -> dict[str, Any]:
        report = run_task_eval(TaskEvalConfig(ckpt=str(run), factors=cfg.factors, per_bin=cfg.per_bin,
                                              seed=cfg.seed, batch_size=cfg.batch_size, dtype=cfg.dtype,
                                              device=cfg.device))
        return {**report, "train_tok_per_s": training_speed(run)}  # the encoding's price

    runs: list[Job] = [(pos, f"{task}/{pos}", None) for task in cfg.tasks for pos in cfg.encodings]
    table, reports = run_lab("tasks", runs_root, out_dir, runs, evaluate, plot_tasks, task_table,
                             doc=TASK_DOC)
    # Every number of the table with what re-derives it: the run, its step and the instances' seeds.
    summary = [{**{k: v for k, v in report.items() if k != "results"},
                "results": [{k: v for k, v in b.items() if k != "records"} for b in report["results"]]}
               for report in reports]
    write_report(out_dir / "tasks.json", {"seed_words": "[EVAL_STREAM, seed, bin, i] (nanoattn.data.tasks)",
                                          "runs": summary})
    print(table, end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {out_dir / TASK_DOC}, "
          f"{out_dir / 'tasks.png'} and {out_dir / 'tasks.json'}")
    return table
