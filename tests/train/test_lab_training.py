"""The extrapolation lab's train=true: every run trained by scripts/train.py, side by side, resumable."""

from __future__ import annotations

import pytest

from nanoattn.commands.labs import train_runs
from nanoattn.logging import read_metrics


def test_the_lab_trains_its_runs_side_by_side_resumes_them_and_names_a_failure(tmp_path, tiny_config,
                                                                               as_overrides, capsys):
    # The tiny model and data of the training tests over the lab's experiment; pos comes from the
    # lab, and the experiment's 4 layers stay (iRoPE's layout has 4 entries).
    overrides = [o for o in as_overrides(tiny_config(tmp_path / "unused", max_steps=2, eval_interval=0))
                 if not o.startswith(("out_dir=", "model.pos=", "model.n_layer=", "logger."))]
    runs = tmp_path / "runs"
    train_runs("extrapolation", runs, ["rope", "irope"], 2, overrides)
    for name in ("rope", "irope"):
        assert [r["step"] for r in read_metrics(runs / name / "metrics.jsonl")][-1] == 2
        assert (runs / name / "checkpoints" / "latest").read_text().strip() == "000002"
    assert (runs / "irope" / "config.yaml").read_text().count("nope") == 1  # the layout, from configs/pos
    first = (runs / "rope" / "metrics.jsonl").read_text()
    train_runs("extrapolation", runs, ["rope"], 1, overrides)  # finished: resumed, nothing trained again
    assert (runs / "rope" / "metrics.jsonl").read_text() == first
    assert "resumed from" in (runs / "rope.log").read_text()
    with pytest.raises(ValueError, match=r"training failed for bogus: see .*<name>\.log"):
        train_runs("extrapolation", runs, ["bogus"], 1, overrides)
    assert "rope: trained in" in capsys.readouterr().out
