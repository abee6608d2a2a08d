"""``labs``: one training job of each lab, eager and compiled, as the lab runs it: what compiling the
step does to a lab's wall time.

- A lab trains one job per row and seed, all of one shape: its rows change the encoding or the
  attention variant, not the batch, the length or the steps. So one job per lab stands for all of
  them (``LAB_JOBS``, the overrides of one row). The attention lab trains the extrapolation lab's
  shape and recipe; the passkey lab fine-tunes at that shape; the task labs share the tasks job's.
- Each job is the training command the lab scripts run (``trainer``; scripts/bench.py gives its
  scripts/train.py), a process of its own in a temporary folder, at the bench's thread count.
  A lab with two workers gives each job half the cores, which ``threads=1`` on two cores measures.
- Per lab: one job compiled with the compile cache as found, then ``labs_repeats`` rounds of an
  eager job and a compiled one, alternated so the machine's load falls on both modes alike. The
  first compiled job fills the cache if it was cold and runs once; the later ones pay what every
  later job of the lab pays, reading it. A row per mode: ``wall_s`` is the median of its jobs'
  whole commands (start-up, data, evaluations and compilation included), ``wall_s_low`` and
  ``wall_s_high`` their range, ``train_s`` the median of the runs' training times from their
  metrics, and ``vs_eager`` the eager median over this mode's.
- ``labs_steps`` gives every job that many steps; by default each runs the lab's own, since a
  job's length decides whether compiling it pays. ``quick`` does not shorten them.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from nanoattn.bench.core import BenchConfig, Row, section
from nanoattn.logging import read_metrics, training_seconds
from nanoattn.validation import fail

LAB_JOBS: dict[str, tuple[str, ...]] = {
    "extrapolation": ("experiment=extrapolation", "pos=rope"),
    "tasks": ("experiment=tasks", "task=copy", "pos=rope"),
    "arithmetic": ("experiment=arithmetic", "pos=abacus_fire"),
}
FIRST_JOB = ("compiled, cache as found", "true")
ROUND = (("eager", "false"), ("compiled, cache warm", "true"))  # each lab runs labs_repeats rounds


def job_order(repeats: int) -> list[tuple[str, str]]:
    """(mode, train.compile) of a lab's jobs in the order they run."""
    return [FIRST_JOB, *ROUND * repeats]


def run_job(trainer: Sequence[str], overrides: Sequence[str], folder: Path, threads: int) -> float:
    """Train one job into ``folder`` with ``trainer``; its wall seconds. A failure: one line, its error."""
    command = [*trainer, *overrides, f"hydra.run.dir={folder}", "logger=none"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    seconds = time.perf_counter() - start
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"bench.labs: {' '.join(overrides)} failed (exit {done.returncode}): {last}")
    return seconds


@section("labs")
def labs_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Each lab's job compiled (cache as found), then eager and compiled (cache warm) alternated."""
    if not cfg.trainer:
        fail("bench", "trainer", cfg.trainer, "must be the training command, e.g. [python, scripts/train.py]")
    threads = cfg.threads or torch.get_num_threads()
    common = [f"train.device={cfg.device}"]
    if cfg.labs_steps is not None:
        common.append(f"train.max_steps={cfg.labs_steps}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nanoattn-labs-") as tmp:
        for lab, job in LAB_JOBS.items():
            jobs: dict[str, list[dict]] = {}
            for i, (mode, compiled) in enumerate(job_order(cfg.labs_repeats)):
                folder = Path(tmp) / lab / str(i)
                wall = run_job(cfg.trainer, [*job, *common, f"train.compile={compiled}"], folder, threads)
                metrics = read_metrics(folder / "metrics.jsonl")
                jobs.setdefault(mode, []).append(dict(steps=metrics[-1]["step"], wall_s=wall,
                                                      train_s=training_seconds(metrics)[-1]))
            eager = statistics.median(j["wall_s"] for j in jobs["eager"])
            for mode, runs in jobs.items():
                walls = [j["wall_s"] for j in runs]
                rows.append(dict(lab=lab, job=" ".join(job[1:]), mode=mode, runs=len(runs),
                                 steps=runs[0]["steps"], threads=threads, wall_s=statistics.median(walls),
                                 wall_s_low=min(walls), wall_s_high=max(walls),
                                 train_s=statistics.median(j["train_s"] for j in runs),
                                 vs_eager=eager / statistics.median(walls)))
    return rows
