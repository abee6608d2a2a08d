"""``labs``: one training job of each lab, eager and compiled, as the lab runs it: what compiling the
step does to a lab's wall time.

- A lab trains one job per row and seed, all of one shape: its rows change the encoding or the
  attention variant, not the batch, the length or the steps. So one job per lab stands for all of
  them (``LAB_JOBS``, the overrides of one row). The attention lab trains the extrapolation lab's
  shape and recipe; the passkey lab fine-tunes at that shape; the task labs share the tasks job's.
- Each job is the training command the lab scripts run (``trainer``; scripts/bench.py gives its
  scripts/train.py), a process of its own in a temporary folder, at the bench's thread count.
  A lab with two workers gives each job half the cores, which ``threads=1`` on two cores measures.
- Three jobs per lab, in turn: compiled with the compile cache as found, eager, compiled again.
  The first compiled job fills the cache if it was cold; the second pays what every later job of
  the lab pays, reading it. ``wall_s`` is the whole command (start-up, data, evaluations and
  compilation included), ``train_s`` the run's training time from its metrics, and ``vs_eager``
  the eager job's wall time over this one's.
- ``labs_steps`` gives every job that many steps; by default each runs the lab's own, since a
  job's length decides whether compiling it pays. ``quick`` does not shorten them.
"""

from __future__ import annotations

import os
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
JOB_ORDER = (("compiled, cache as found", "true"), ("eager", "false"), ("compiled, cache warm", "true"))


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
    """Each lab's job, compiled (cache as found), eager, and compiled (cache warm), one after another."""
    if not cfg.trainer:
        fail("bench", "trainer", cfg.trainer, "must be the training command, e.g. [python, scripts/train.py]")
    threads = cfg.threads or torch.get_num_threads()
    common = [f"train.device={cfg.device}"]
    if cfg.labs_steps is not None:
        common.append(f"train.max_steps={cfg.labs_steps}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="nanoattn-labs-") as tmp:
        for lab, job in LAB_JOBS.items():
            jobs = []
            for i, (mode, compiled) in enumerate(JOB_ORDER):
                folder = Path(tmp) / lab / str(i)
                wall = run_job(cfg.trainer, [*job, *common, f"train.compile={compiled}"], folder, threads)
                metrics = read_metrics(folder / "metrics.jsonl")
                jobs.append(dict(lab=lab, job=" ".join(job[1:]), mode=mode, steps=metrics[-1]["step"],
                                 threads=threads, wall_s=wall, train_s=training_seconds(metrics)[-1]))
            eager = next(j["wall_s"] for j in jobs if j["mode"] == "eager")
            rows += [{**j, "vs_eager": eager / j["wall_s"]} for j in jobs]
    return rows
