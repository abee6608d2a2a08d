"""``speedrun``: a reference recipe against a candidate, each a whole training run, back to back.

- Both are training runs through ``nanoattn.train.train`` on the default data, built from
  ``RunConfig(model=preset("llama-tiny"))`` (``python scripts/train.py recipe=adamw_baseline``)
  plus overrides: ``speedrun_reference`` (by default ``model.attn_kernel=sdpa``: the baseline on
  SDPA's kernel) and ``speedrun_candidate`` (by default the default recipe's,
  ``nanoattn.config.options.RECIPES["default"]``), each ``key=value`` with
  the value read as YAML. They run back to back
  in this process on the same machine state, each evaluating every ``speedrun_eval_interval``
  steps on the same fixed validation windows.
- Training time is what each run's metrics say: the sum over its log windows of tokens /
  tok_per_s, so evaluations and checkpoints are left out (the issue's table counts the same).
- Time to target: the training time at which val_bpb first reaches ``speedrun_target``,
  interpolated linearly between the evaluations around the crossing; null if it never does.
  ``speedup`` is the reference's time to target over the run's; ``share_of_reference_time`` is the
  run's time to target over the reference's whole training time (the issue's bar: at most 0.5
  for a target the reference reaches only at its end).
- Fixed budget: each run's val_bpb at the reference's whole training time, interpolated the same
  way (null for a run that trained for less).
- ``quick``: 30 steps each, a check that the section runs, not a measurement.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from nanoattn.bench.core import BenchConfig, Row, section
from nanoattn.config import ModelConfig, RunConfig, preset
from nanoattn.logging import read_metrics, training_seconds
from nanoattn.train import train


def recipe(overrides: Sequence[str], base_model: ModelConfig | None = None, **train_fields: Any) -> RunConfig:
    """recipe=adamw_baseline's run with ``overrides`` (``a.b=value``, YAML values) and ``train_fields``;
    ``base_model`` replaces its model (llama-tiny) before the overrides apply."""
    values = RunConfig(model=base_model or preset("llama-tiny")).to_dict()
    values["train"]["min_lr"] = None  # declared None (lr / 10): derived again from the overridden lr
    for override in overrides:
        key, sep, text = override.partition("=")
        path = key.split(".")
        node = values
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"bench.speedrun override {override!r} is invalid: {key!r} is not a run key")
            node = node[part]
        if not sep or path[-1] not in node:
            raise ValueError(f"bench.speedrun override {override!r} is invalid: expected key=value with a "
                             "run key such as train.optimizer=muon")
        node[path[-1]] = yaml.safe_load(text)
    values["train"].update(train_fields)
    return RunConfig.from_dict(values)


def training_curve(metrics: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """(training seconds so far, val_bpb) at each evaluation, from a run's metrics records."""
    return [(seconds, record["val_bpb"]) for seconds, record in zip(training_seconds(metrics), metrics,
                                                                     strict=True) if "val_bpb" in record]


def time_to(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """The first training time at which the curve reaches ``target`` (linear between points)."""
    previous = None
    for point in curve:
        if point[1] <= target:
            if previous is None:
                return point[0]
            (t0, b0), (t1, b1) = previous, point
            return t0 + (t1 - t0) * (b0 - target) / (b0 - b1)
        previous = point
    return None


def value_at(curve: Sequence[tuple[float, float]], seconds: float) -> float | None:
    """The curve's val_bpb at ``seconds`` of training (linear between points); None past its end."""
    for (t0, b0), (t1, b1) in zip(curve, curve[1:], strict=False):
        if t0 <= seconds <= t1:
            return b0 + (b1 - b0) * (seconds - t0) / (t1 - t0) if t1 > t0 else b1
    if curve and abs(curve[-1][0] - seconds) < 1e-9:
        return curve[-1][1]
    return None


@section("speedrun")
def speedrun_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Train the reference and the candidate back to back; time to target and bpb at a fixed budget."""
    fields = dict(eval_interval=cfg.speedrun_eval_interval, ckpt_interval=0, keep_last=1, device=cfg.device)
    if cfg.quick:
        fields.update(max_steps=30, warmup_steps=3, eval_interval=10, eval_steps=2)
    recipes = {"reference": cfg.speedrun_reference, "candidate": cfg.speedrun_candidate}
    configs = {name: recipe(overrides, **fields) for name, overrides in recipes.items()}
    curves, rates = {}, {}
    with tempfile.TemporaryDirectory(prefix="nanoattn-speedrun-") as tmp:
        for name, run in configs.items():
            run.out_dir = str(Path(tmp) / name)
            run.logger.type = "none"
            metrics = read_metrics(train(run) / "metrics.jsonl")
            curves[name] = training_curve(metrics)
            speeds = [r["tok_per_s"] for r in metrics if "tok_per_s" in r]
            rates[name] = statistics.median(speeds[1:] or speeds)  # the first window warms up
    rows = []
    for name, score in scores(curves, cfg.speedrun_target).items():
        rows.append(dict(recipe=name, overrides=" ".join(recipes[name]) or "(none: recipe=adamw)",
                         steps=configs[name].train.max_steps, train_s=round(curves[name][-1][0], 1),
                         tok_per_s=rates[name], val_bpb=curves[name][-1][1], target=cfg.speedrun_target,
                         **score))
    return rows


def scores(curves: Mapping[str, Sequence[tuple[float, float]]], target: float) -> dict[str, dict[str, Any]]:
    """Each run's time to ``target`` and its ratios against the ``reference`` curve (module docstring)."""
    budget = curves["reference"][-1][0]
    reference_time = time_to(curves["reference"], target)
    out = {}
    for name, curve in curves.items():
        reached = time_to(curve, target)
        both = reached is not None and reference_time is not None
        out[name] = dict(time_to_target_s=None if reached is None else round(reached, 1),
                         speedup=reference_time / reached if both else None,
                         share_of_reference_time=None if reached is None else reached / budget,
                         bpb_at_reference_budget=value_at(curve, budget))
    return out
