"""``sweep``: the recipe table of a finished sweep (``configs/experiment/recipe_sweep.yaml``).

- ``sweep`` is a folder of run directories ``<recipe>/seed<k>``, as the sweep config lays them
  out. For every run: the steps and the training time it needed to reach ``speedrun_target``
  (interpolated between its evaluations, ``speedrun.time_to``; time from its own log windows,
  ``speedrun.training_curve``), its final val_bpb and its median tokens/s; then a row per recipe
  with the means over its seeds.
- Steps to the target do not depend on the machine's load; the seconds do, and the sweep's runs
  may have shared the cores with each other. The speed of a recipe is therefore measured apart,
  side by side, by the ``speedrun`` and ``train`` sections; this table ranks sample efficiency.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path

from nanoattn.bench.core import BenchConfig, Row, section
from nanoattn.bench.speedrun import time_to, training_curve
from nanoattn.logging import read_metrics


def run_row(run: Path, target: float) -> Row:
    """One run's steps and seconds to ``target``, final val_bpb and median tokens/s."""
    metrics = read_metrics(run / "metrics.jsonl")
    steps = [(r["step"], r["val_bpb"]) for r in metrics if "val_bpb" in r]
    if not steps:
        raise ValueError(f"bench.sweep: {run} has no evaluation in its metrics.jsonl")
    seconds = time_to(training_curve(metrics), target)
    speeds = [r["tok_per_s"] for r in metrics if "tok_per_s" in r]
    return dict(recipe=run.parent.name, seed=run.name, steps=steps[-1][0],
                steps_to_target=time_to(steps, target), time_to_target_s=seconds, val_bpb=steps[-1][1],
                tok_per_s=statistics.median(speeds[1:] or speeds))


@section("sweep")
def sweep_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Every run of ``sweep`` and a mean row per recipe, against ``speedrun_target``."""
    if cfg.sweep is None:
        return [dict(note="skipped: pass sweep=<folder> (from python scripts/train.py -m "
                          "experiment=recipe_sweep)")]
    runs = sorted(p.parent for p in Path(cfg.sweep).glob("*/*/metrics.jsonl"))
    if not runs:
        raise ValueError(f"bench.sweep={cfg.sweep!r} holds no <recipe>/<seed>/metrics.jsonl")
    rows = [run_row(run, cfg.speedrun_target) for run in runs]
    for recipe in dict.fromkeys(r["recipe"] for r in rows):
        seeds = [r for r in rows if r["recipe"] == recipe]
        reached = [r["steps_to_target"] for r in seeds]
        rows.append(dict(recipe=recipe, seed=f"mean of {len(seeds)}", steps=seeds[0]["steps"],
                         steps_to_target=None if None in reached else statistics.mean(reached),
                         val_bpb=statistics.mean(r["val_bpb"] for r in seeds),
                         tok_per_s=statistics.mean(r["tok_per_s"] for r in seeds)))
    return rows
