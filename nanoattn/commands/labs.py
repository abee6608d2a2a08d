"""``scripts/extrapolation_lab.py`` and ``scripts/attention_lab.py``: the labs, one driver.

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
from nanoattn.config import ModelConfig
from nanoattn.eval.compare import length_table
from nanoattn.eval.passkey import passkey_summary_table
from nanoattn.eval.plots import plot_length_curves, plot_passkey
from nanoattn.eval.runs import is_path, scaling_tag
from nanoattn.eval.tables import write_table
from nanoattn.logging import read_metrics
from nanoattn.model import KVCache
from nanoattn.runtime import DTYPES, check_device_name
from nanoattn.validation import check_bool, check_choice, check_positive_int, fail

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
                      "diff", "mla")
ATTENTION_DOC = "attention.md"

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


def train_runs(lab: str, runs_root: Path, names: Sequence[str], workers: int,
               overrides: Sequence[str], group: str = "pos") -> None:
    """Train ``<runs_root>/<name>`` for each name with ``scripts/train.py experiment=<lab> <group>=<name>``,
    ``workers`` processes at a time, each on cpu_count // workers threads (small models use cores
    better side by side than one model on all of them). A run already there is resumed, so a
    finished one ends at once and a killed lab continues. Each run's output goes to
    ``<runs_root>/<name>.log``; a failed run is named with its log once the others are done.
    """
    script = Path(__file__).resolve().parents[2] / "scripts" / "train.py"
    if not script.is_file():
        raise ValueError(f"train=true needs the repository's {script} (an editable install of nanoattn)")
    runs_root.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // workers))}
    pending, running, failed = list(names), {}, []
    while pending or running:
        while pending and len(running) < workers:
            name = pending.pop(0)
            resume = ["train.resume=true"] if (runs_root / name / "config.yaml").exists() else []
            command = [sys.executable, str(script), f"experiment={lab}", f"{group}={name}",
                       f"out_dir={runs_root}", "logger=none", *resume, *overrides]
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
            table: Callable[[Reports, Sequence[str]], str], *, group: str = "pos", doc: str = LAB_DOC) -> str:
    """Evaluate every job, then write ``<out_dir>/<lab>.png`` and the table (in ``<out_dir>/<doc>``);
    returns the table."""
    missing = sorted({pos for _, pos, _ in jobs if not (runs_root / pos).is_dir()})
    if missing:
        names = ",".join(dict.fromkeys(pos for _, pos, _ in jobs))
        raise ValueError(f"no run directory for {', '.join(missing)} under {runs_root}; train them with "
                         f"python scripts/train.py -m experiment={lab} {group}={names}")
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
    return text


def extrapolation_lab(cfg: LabConfig) -> str:
    """The command: run the perplexity lab (or, with ``passkey``, the passkey lab); print its table."""
    began = time.perf_counter()
    runs_root = Path(cfg.runs_root or f"runs/{cfg.lab}")
    out_dir = Path(cfg.out_dir)
    common = dict(batch_size=cfg.batch_size, dtype=cfg.dtype, device=cfg.device)
    if cfg.train:
        train_runs(cfg.lab, runs_root, LAB_ENCODINGS, cfg.workers, cfg.train_overrides)
    plain: list[Job] = [(pos, pos, None) for pos in LAB_ENCODINGS]
    if cfg.passkey:
        table = run_lab(cfg.lab, runs_root, out_dir, plain,
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

        table = run_lab(cfg.lab, runs_root, out_dir, plain + scaled, evaluate, plot_length_curves,
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
        train_runs("attention", runs_root, ATTENTION_VARIANTS, cfg.workers, cfg.train_overrides,
                   group="attention")

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
    table = run_lab("attention", runs_root, out_dir, jobs, evaluate, plot_length_curves, length_table,
                    group="attention", doc=ATTENTION_DOC)
    print(table, end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {out_dir / ATTENTION_DOC} and "
          f"{out_dir / 'attention.png'}")
    return table
