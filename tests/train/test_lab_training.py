"""A lab's train=true: every run trained by scripts/train.py, side by side, finished runs left alone."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nanoattn.commands.labs import LABS, ArithmeticLabConfig, TaskLabConfig, is_finished, run_lab, train_runs
from nanoattn.logging import read_metrics

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def lab_overrides(tiny_config, as_overrides, tmp_path, *drop: str, **train) -> list[str]:
    """The tiny model and data of the training tests, over a lab's experiment."""
    return [o for o in as_overrides(tiny_config(tmp_path / "unused", **{"eval_interval": 0, **train}))
            if not o.startswith(("out_dir=", "model.pos=", "logger.", *drop))]


def test_the_lab_trains_its_runs_side_by_side_resumes_them_and_names_a_failure(tmp_path, tiny_config,
                                                                               as_overrides, trainer, capsys):
    # The experiment's 4 layers stay: iRoPE's layout has 4 entries.
    overrides = lab_overrides(tiny_config, as_overrides, tmp_path, "model.n_layer=", max_steps=2)
    runs = tmp_path / "runs"
    jobs = {runs / "rope" / "seed0": ["experiment=extrapolation", "pos=rope", "train.seed=0", *overrides],
            runs / "irope" / "seed1": ["experiment=extrapolation", "pos=irope", "train.seed=1", *overrides]}
    train_runs(trainer.command, jobs, 2)
    for run in jobs:
        assert [r["step"] for r in read_metrics(run / "metrics.jsonl")][-1] == 2 and is_finished(run)
    assert (runs / "irope" / "seed1" / "config.yaml").read_text().count("nope") == 1  # irope's layout
    first = (runs / "rope" / "seed0" / "metrics.jsonl").read_text()
    log = (runs / "rope" / "seed0.log").read_text()
    # Finished: not started again.
    train_runs(trainer.command, jobs, 1)
    assert (runs / "rope" / "seed0" / "metrics.jsonl").read_text() == first
    assert (runs / "rope" / "seed0.log").read_text() == log
    with pytest.raises(ValueError, match=r"training did not finish .*bogus/seed0: see <run>\.log beside"):
        train_runs(trainer.command, {runs / "bogus" / "seed0": ["experiment=extrapolation", "pos=bogus"]}, 1)
    assert "seed0: trained in" in capsys.readouterr().out


def test_the_task_lab_trains_every_pair_then_publishes_its_page(tmp_path, tiny_config, as_overrides, trainer):
    # One seed: the seeds of a lab's rows are the driver's, as in every lab (tests/eval/test_labs.py).
    # experiment=tasks drops the default recipe itself: its runs keep the suite's own optimizer keys.
    overrides = lab_overrides(tiny_config, as_overrides, tmp_path, "~recipe", "model.max_seq_len",
                              max_steps=3, eval_interval=3)  # the experiment stops a run at its accuracy
    cfg = TaskLabConfig(tasks=["copy"], encodings=["learned"], variants=["fox"],
                        variant_tasks=["copy"], seeds=[0], train=True, per_bin=8, factors=[1, 4],
                        runs_root=str(tmp_path / "runs"),
                        train_overrides=overrides + ["model.max_seq_len=40"])
    page = run_lab(LABS["tasks"], cfg, trainer)
    rows = {row["label"]: row for row in page["rows"]}
    assert list(rows) == ["copy/learned", "copy/fox"]
    fox = yaml.safe_load((tmp_path / "runs" / "copy" / "fox" / "seed0" / "config.yaml").read_text())["model"]
    assert fox["forget_gate"] and fox["pos"] == "nope"
    # The learned table has 40 rows: at 4x (up to 67 tokens) it cannot run, and says so; NoPE can.
    assert rows["copy/learned"]["values"]["exact 4x"] == [None]
    assert all(isinstance(value, float) for value in rows["copy/fox"]["values"]["exact 4x"])
    # Three steps learn nothing: each row says so rather than scoring lengths it never learned.
    assert all(row["status"].startswith("not learned (") for row in rows.values())
    assert rows["copy/learned"]["values"]["steps"] == [3]  # the budget spent, its accuracy not reached
    assert (tmp_path / "runs" / "tasks.md").is_file() and (tmp_path / "runs" / "tasks.png").is_file()
    assert (tmp_path / "runs" / "copy" / "fox" / "seed0" / "task_eval.json").is_file()


def test_the_arithmetic_lab_trains_its_rows_then_publishes_its_page(tmp_path, tiny_config, as_overrides,
                                                                    trainer):
    # The experiment's layers stay: the paper's row has its own 1.
    overrides = lab_overrides(tiny_config, as_overrides, tmp_path, "~recipe", "model.n_layer=", max_steps=3)
    cfg = ArithmeticLabConfig(rows=["abacus_fire", "coupling_paper"], digits=2, seeds=[0], train=True,
                              per_bin=8, factors=[1, 4], runs_root=str(tmp_path / "runs"),
                              train_overrides=overrides)
    page = run_lab(LABS["arithmetic"], cfg, trainer)
    rows = {row["label"]: row for row in page["rows"]}
    assert list(rows) == ["abacus_fire", "coupling_paper"]
    assert all(row["status"].startswith("not learned (") for row in rows.values())  # three steps
    assert {f["better"] for f in page["findings"]} >= {"abacus_fire", "coupling_paper"}
    assert (tmp_path / "runs" / "arithmetic.md").is_file()
    runs = tmp_path / "runs"
    config = yaml.safe_load((runs / "coupling_paper" / "seed0" / "config.yaml").read_text())
    assert config["task"] | {"name": "addition", "train_length": 2, "reversed_operands": False,
                             "position_coupling": True, "zero_padded": True,
                             "independent_lengths": True} == config["task"]
    assert config["model"]["pos"] == "learned" and config["model"]["n_layer"] == 1
    abacus = yaml.safe_load((runs / "abacus_fire" / "seed0" / "config.yaml").read_text())["model"]
    assert abacus["abacus"] and abacus["abacus_digits"] == list(b"0123456789") and abacus["pos"] == "fire"


def test_a_lab_interrupted_then_rerun_publishes_the_table_of_an_uninterrupted_one(tmp_path, tiny_config,
                                                                                 as_overrides, trainer):
    """SIGTERM to a lab stops its training, which saves; the rerun resumes it and publishes the same
    numbers as a lab that was never stopped (all but the training speed, a measurement of the machine)."""
    overrides = lab_overrides(tiny_config, as_overrides, tmp_path, "~recipe", "model.max_seq_len",
                              max_steps=40, ckpt_interval=0, eval_interval=40)
    overrides.append("model.max_seq_len=40")

    def config(root: str) -> TaskLabConfig:
        return TaskLabConfig(tasks=["copy"], encodings=["rope"], variants=[], seeds=[0], train=True,
                             per_bin=8, factors=[1, 2], runs_root=str(tmp_path / root),
                             train_overrides=overrides)

    run = tmp_path / "stopped" / "copy" / "rope" / "seed0"
    script = (f"import sys; sys.path.insert(0, {str(SCRIPTS)!r}); "
              "from _hydra_cli import TRAINER, training_config; "
              "from nanoattn.commands.labs import LABS, TaskLabConfig, Trainer, run_lab; "
              f"run_lab(LABS['tasks'], {config('stopped')!r}, Trainer(TRAINER, training_config))")
    lab = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").is_file() or not (run / "metrics.jsonl").read_text():
        assert time.monotonic() < deadline and lab.poll() is None
        time.sleep(0.1)
    lab.terminate()
    assert lab.wait(timeout=120) != 0
    # The training saved where it stopped (its only checkpoint: ckpt_interval=0), unfinished, no page.
    assert 0 < json.loads((run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
                           / "config.json").read_text())["step"] < 40
    assert not is_finished(run) and not (tmp_path / "stopped" / "tasks.json").exists()

    def numbers(page: dict) -> dict:
        return {row["label"]: row["values"] for row in page["rows"]}

    def losses(root: str) -> list:
        return [(r["step"], r["train_loss"]) for r in read_metrics(
            tmp_path / root / "copy" / "rope" / "seed0" / "metrics.jsonl") if "train_loss" in r]

    resumed = run_lab(LABS["tasks"], config("stopped"), trainer)
    assert numbers(resumed) == numbers(run_lab(LABS["tasks"], config("whole"), trainer))
    # Resumed where it stopped, not restarted: one record per step, each the uninterrupted run's.
    assert losses("stopped") == losses("whole")
