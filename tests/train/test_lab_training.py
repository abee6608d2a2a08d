"""The extrapolation lab's train=true: every run trained by scripts/train.py, side by side, resumable."""

from __future__ import annotations

import json

import pytest

from nanoattn.commands.labs import TaskLabConfig, task_lab, train_runs
from nanoattn.logging import read_metrics


def test_the_lab_trains_its_runs_side_by_side_resumes_them_and_names_a_failure(tmp_path, tiny_config,
                                                                               as_overrides, capsys):
    # The tiny model and data of the training tests over the lab's experiment; pos comes from the
    # lab, and the experiment's 4 layers stay (iRoPE's layout has 4 entries).
    overrides = [o for o in as_overrides(tiny_config(tmp_path / "unused", max_steps=2, eval_interval=0))
                 if not o.startswith(("out_dir=", "model.pos=", "model.n_layer=", "logger."))]
    runs = tmp_path / "runs"
    jobs = {name: [f"pos={name}", f"out_dir={runs}"] for name in ("rope", "irope", "bogus")}
    train_runs("extrapolation", runs, {name: jobs[name] for name in ("rope", "irope")}, 2, overrides)
    for name in ("rope", "irope"):
        assert [r["step"] for r in read_metrics(runs / name / "metrics.jsonl")][-1] == 2
        assert (runs / name / "checkpoints" / "latest").read_text().strip() == "000002"
    assert (runs / "irope" / "config.yaml").read_text().count("nope") == 1  # the layout, from configs/pos
    first = (runs / "rope" / "metrics.jsonl").read_text()
    # Finished: resumed, nothing trained again.
    train_runs("extrapolation", runs, {"rope": jobs["rope"]}, 1, overrides)
    assert (runs / "rope" / "metrics.jsonl").read_text() == first
    assert "resumed from" in (runs / "rope.log").read_text()
    with pytest.raises(ValueError, match=r"training failed for bogus: see .*<name>\.log"):
        train_runs("extrapolation", runs, {"bogus": jobs["bogus"]}, 1, overrides)
    assert "rope: trained in" in capsys.readouterr().out


def test_the_task_lab_trains_every_task_and_encoding_then_writes_table_figure_and_summary(
        tmp_path, tiny_config, as_overrides, capsys):
    # experiment=tasks drops the default recipe itself: its runs keep the suite's own optimizer keys.
    overrides = [o for o in as_overrides(tiny_config(tmp_path / "unused", max_steps=3, eval_interval=0))
                 if not o.startswith(("~recipe", "out_dir=", "model.pos=", "logger.", "model.max_seq_len"))]
    docs = tmp_path / "docs"
    cfg = TaskLabConfig(tasks=["copy", "counting"], encodings=["nope", "learned"], train=True,
                        runs_root=str(tmp_path / "runs"), out_dir=str(docs), per_bin=8, factors=[1, 4],
                        train_overrides=overrides + ["model.max_seq_len=40"])
    table = task_lab(cfg)
    for task in ("copy", "counting"):
        for pos in ("nope", "learned"):
            assert (tmp_path / "runs" / task / pos / "task_eval.json").is_file()
    # The learned table has 40 rows: at 4x (up to 130 tokens) it cannot run, and says so.
    assert "| copy | learned | " in table and table.count("| n/a |") == 2
    assert "<!-- tasks-table:begin -->" in (docs / "tasks.md").read_text() and (docs / "tasks.png").is_file()
    summary = json.loads((docs / "tasks.json").read_text())
    assert [(r["task"]["name"], r["pos"]) for r in summary["runs"]] == [
        ("copy", "nope"), ("copy", "learned"), ("counting", "nope"), ("counting", "learned")]
    assert all("records" not in b for r in summary["runs"] for b in r["results"])
    assert "lab done in" in capsys.readouterr().out
