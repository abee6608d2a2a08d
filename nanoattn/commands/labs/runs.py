"""A lab's runs: the command that trains each, the refusal of a run of other settings, how far each
went, training them `workers` at a time, and what a finished run trained and measured while training.

A run is finished when its latest checkpoint is at its configured last step, or when that checkpoint
ended the run at its accuracy (``train.stop_at_accuracy``: the checkpoint records the exact match it
reached, which a run cut short at the same step lacks).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from nanoattn.checkpoint import CheckpointError, read_checkpoint_config, read_run_config, trained_length
from nanoattn.config import ModelConfig
from nanoattn.logging import duration_text, read_metrics
from nanoattn.model import parameter_count
from nanoattn.train.run_dir import differing_keys, reached_accuracy

if TYPE_CHECKING:
    from nanoattn.commands.labs.driver import Lab, LabRunsConfig, Row


# Keys a lab's run may hold other values of: where it is and how it was watched, nothing it computed.
LAB_MAY_DIFFER = ("out_dir", "train.resume", "train.log_interval", "train.ckpt_interval", "train.keep_last",
                  "logger.")


def run_dir(runs_root: Path, run: str, seed: int) -> Path:
    return runs_root / run / f"seed{seed}"


def lab_jobs(lab: Lab, cfg: LabRunsConfig, rows: Sequence[Row], runs_root: Path) -> dict[Path, list[str]]:
    """Each run the lab trains, with the whole of its training command's overrides."""
    return {run_dir(runs_root, row.run, seed): [f"experiment={lab.experiment or lab.name}", *row.train,
                                                f"train.seed={seed}", *lab.train_extra(cfg, row, seed),
                                                *lab.scaled, *cfg.train_overrides, "logger=none"]
            for row in rows if row.train for seed in cfg.seeds}


def check_lab_runs(expected: Mapping[Path, Mapping[str, Any]]) -> None:
    """Refuse, in one line, a run directory that holds a run of other settings than the run config
    its command trains (``expected``, by run directory)."""
    for run, config in expected.items():
        if not (run / "config.yaml").exists():
            continue
        differ = differing_keys(read_run_config(run), config, LAB_MAY_DIFFER)
        if differ:
            raise ValueError(f"{run} holds a run of other settings than this lab's ({differ[0]}"
                             f"{f'; +{len(differ) - 1} more' if len(differ) > 1 else ''}): a lab never uses "
                             "it; delete it, or give the lab another runs_root")


def check_starting_runs(lab: Lab, cfg: LabRunsConfig, rows: Sequence[Row]) -> None:
    """A lab whose runs start from another lab's (``starts_from``, under ``cfg.starting_root()``): refuse
    a starting run that is missing or unfinished, before anything trains."""
    for row in rows:
        for seed in cfg.seeds:
            start = run_dir(cfg.starting_root(), row.run, seed)
            went = progress(start)
            if not went.finished:
                state = "is missing" if went.step is None else f"is at step {went.step} of {went.last}"
                raise ValueError(f"{cfg.owner}: {start}, which {row.label}'s seed {seed} starts from, "
                                 f"{state}: train the {lab.starts_from} lab first (its train=true)")


class Progress(NamedTuple):
    """How far a run went (None where it has no checkpoint or no config)."""

    step: int | None  # its latest checkpoint's
    last: int | None  # its configured last step, train.max_steps
    reached: float | None  # the exact match at 1x its latest checkpoint stopped it at, if it did

    @property
    def finished(self) -> bool:
        return self.step is not None and (self.step == self.last or self.reached is not None)


def progress(run: Path) -> Progress:
    try:
        meta = read_checkpoint_config(run)
    except CheckpointError:
        meta = {}
    try:
        train = read_run_config(run, "train")
    except ValueError:
        train = {}
    reached = meta["exact_1x"] if reached_accuracy(meta, train.get("stop_at_accuracy")) else None
    return Progress(meta.get("step"), train.get("max_steps"), reached)


def is_finished(run: Path) -> bool:
    return progress(run).finished


def train_runs(command: Sequence[str], jobs: Mapping[Path, Sequence[str]], workers: int) -> None:
    """Train each run directory of ``jobs`` with ``command <its overrides>``, ``workers`` at a time,
    each on cpu_count // workers threads unless OMP_NUM_THREADS is set.

    Finished runs are skipped and any other run there is resumed. Each run's output goes to
    ``<run>.log``; a failed run is named with its log once the others are done. Interrupting the
    lab (Ctrl-C, SIGTERM) stops the trainings it started, which save and exit, so a rerun resumes them.
    """
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // workers))
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    pending = [run for run in jobs if not is_finished(run)]
    running: dict[Path, tuple[subprocess.Popen, Any, float]] = {}
    failed, ended, started = [], 0, time.perf_counter()

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM would end the lab without its finally, orphaning the trainings

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        while pending or running:
            while pending and len(running) < workers:
                run = pending.pop(0)
                resume = ["train.resume=true"] if (run / "config.yaml").exists() else []
                argv = [*command, *jobs[run], f"hydra.run.dir={run}", *resume]
                run.parent.mkdir(parents=True, exist_ok=True)
                log = run.with_name(f"{run.name}.log").open("a")
                running[run] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env),
                                log, time.perf_counter())
            time.sleep(0.5)
            for run, (process, log, began) in list(running.items()):
                if process.poll() is not None:
                    log.close()
                    del running[run]
                    done = is_finished(run)
                    ended += 1
                    left = (time.perf_counter() - started) / ended * (len(pending) + len(running))
                    print(f"{run}: {'trained' if done else 'stopped'} in {time.perf_counter() - began:.0f} s "
                          f"(exit {process.returncode}); {ended} of {ended + len(pending) + len(running)} "
                          f"runs, ETA {duration_text(left)}", flush=True)
                    if process.returncode or not done:
                        failed.append(run)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process, _, _ in running.values():
            process.send_signal(signal.SIGINT)  # the trainer saves a checkpoint and exits
        for process, log, _ in running.values():
            process.wait()
            log.close()
    if failed:
        raise ValueError(f"training did not finish {', '.join(map(str, failed))}: see <run>.log beside each")


def run_scale(run: Path) -> dict[str, int]:
    """What a finished run trained: its model's parameters, its training tokens, its training length."""
    meta = read_checkpoint_config(run)
    parameters = parameter_count(ModelConfig.from_dict(meta["model"]))
    tokens = [r["tokens"] for r in read_metrics(run / "metrics.jsonl") if "tokens" in r]
    return {"parameters": parameters, "tokens": tokens[-1] if tokens else 0,
            "train_length": trained_length(meta)}


def largest_attention_logit(run: Path) -> float | None:
    """The largest ``max_attn_logit`` a run logged at its evaluations (metrics.jsonl), None if none."""
    logits = [r["max_attn_logit"] for r in read_metrics(run / "metrics.jsonl") if "max_attn_logit" in r]
    return max(logits) if logits else None



