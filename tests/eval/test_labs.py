"""The labs' driver: rows over seeds, finished runs only, a results page in runs/<lab>/ by default."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import pytest
import torch

from nanoattn import GPT, ModelConfig
from nanoattn.checkpoint import save_checkpoint
from nanoattn.commands.labs import (
    ARITHMETIC_ROWS,
    DIGIT_FACTORS,
    LABS,
    ArithmeticLabConfig,
    AttentionLabConfig,
    LabConfig,
    Row,
    TaskLabConfig,
    is_finished,
    run_lab,
    task_lab,
)
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.data import TokenData
from nanoattn.eval.tasks import size_bins

REPO = Path(__file__).resolve().parents[2]


def save_run(run: Path, data_dir: Path, *, seed: int, step: int = 100, last: int = 100,
             stop_at_accuracy: float | None = None, measured: dict | None = None, **fields) -> Path:
    """A run directory as training leaves it: a checkpoint at ``step`` of ``last`` (with what was
    ``measured`` on it), config, metrics."""
    torch.manual_seed(seed)
    shape = dict(vocab_size=TokenData(data_dir).vocab_size, d_model=32, n_layer=2, n_head=4, n_kv_head=2,
                 d_ff=64, max_seq_len=16)
    model = GPT(ModelConfig(**{**shape, **fields})).eval()
    save_checkpoint(run / "checkpoints", f"{step:06d}", model, train_seq_len=16, step=step,
                    tokenizer_file=data_dir / "tokenizer.json", measured=measured)
    (run / "config.yaml").write_text(f"data:\n  root: {data_dir.parent}\n  name: {data_dir.name}\n"
                                     f"train:\n  max_steps: {last}\n"
                                     f"  stop_at_accuracy: {json.dumps(stop_at_accuracy)}\n")
    records = [{"step": 10, "tokens": 1000, "tok_per_s": 1000.0 + seed},
               {"step": 20, "tokens": 2000, "tok_per_s": 3000.0, "max_attn_logit": 7.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


ROWS = [Row("rope", "rope", ("pos=rope",)), Row("alibi", "alibi", ("pos=alibi",)),
        Row("rope+yarn4", "rope", (), {"type": "yarn", "factor": 4})]


def test_the_plans_are_read_from_the_registries():
    extrapolation = [row.label for row in LABS["extrapolation"].rows(LabConfig())]
    assert extrapolation[:len(encoding_options())] == list(encoding_options())
    assert extrapolation[len(encoding_options()):] == [
        "rope+linear4", "rope+linear16", "rope+ntk4", "rope+dynamic4", "rope+yarn4", "rope+yarn16"]
    attention = LABS["attention"].rows(AttentionLabConfig())
    assert [row.label for row in attention] == [*ATTENTION_VARIANTS, "pope"]
    assert attention[-1].train == ("pos=pope",)  # the plain block with PoPE
    assert [row.train for row in LABS["passkey"].rows(LabConfig(passkey=True))][:2] == [("pos=sinusoidal",),
                                                                                      ("pos=sinusoidal_scaled",)]


def test_the_arithmetic_labs_rows_are_its_methods_at_its_digits():
    rows = {row.label: row.train for row in LABS["arithmetic"].rows(ArithmeticLabConfig(digits=3))}
    assert list(rows) == list(ARITHMETIC_ROWS)
    assert all(train[-1] == "task.train_length=3" for train in rows.values())
    # Randomized positions are drawn from the width of the longest row scored: 12 digits, 3 x 12 + 4.
    assert rows["random_rope"] == ("pos=rope", "train.random_positions=40", "task.train_length=3")
    with pytest.raises(ValueError, match="^arithmetic_lab.rows='sort' is invalid: allowed: nope \\| rope"):
        ArithmeticLabConfig(rows=["nope", "sort"])


def test_the_arithmetic_page_names_its_best_rows_reach_and_says_what_did_not_reproduce():
    notes = LABS["arithmetic"].notes
    values = {"nope": {"exact 1x": [1.0, 1.0], "exact 2x": [0.95, 0.9], "exact 3x": [0.9, 0.5]},
              "abacus": {"exact 1x": [1.0, 0.98], "exact 2x": [0.0, 0.1]},
              "coupling": {"exact 1x": [0.5, 0.6], "exact 4x": [1.0, 1.0]}}  # not learned: never the best
    first, second = notes(values)
    assert first.startswith("**Best row: nope, exact match at or above 0.9 up to 2D digits**")
    assert second.startswith("No row generalizes past 2D here")
    values["abacus"].update({"exact 3x": [0.92, 0.9], "exact 4x": [0.95, 0.95]})  # 2x below: it stops there
    assert notes(values)[0].startswith("**Best row: nope, ")
    values["nope"]["exact 2x"] = [0.5, 0.9]
    assert notes(values)[0] == "**No row holds exact match 0.9 past D digits** (the bar: past 2D)."
    values["nope"]["exact 2x"] = [0.95, 0.9]
    values["abacus"]["exact 2x"] = [0.9, 0.92]
    assert notes(values) == ["**Best row: abacus, exact match at or above 0.9 up to 4D digits** (the bar: "
                             "past 2D)."]


def test_a_lab_publishes_every_seed_with_intervals_and_never_an_unfinished_run(prepared, tmp_path, capsys):
    lab = dataclasses.replace(LABS["extrapolation"], rows=lambda cfg: ROWS)
    runs = tmp_path / "runs"
    cfg = LabConfig(runs_root=str(runs), seeds=[0, 1], max_tokens=256)
    save_run(runs / "rope" / "seed0", prepared, seed=0)
    save_run(runs / "rope" / "seed1", prepared, seed=1)
    save_run(runs / "alibi" / "seed0", prepared, seed=0, pos="alibi")
    with pytest.raises(ValueError, match=r"^no run directory .*alibi/seed1 \(and 0 more\); run the lab with"):
        run_lab(lab, cfg, trainer=())
    save_run(runs / "alibi" / "seed1", prepared, seed=1, step=40, pos="alibi")  # stopped at step 40 of 100
    page = run_lab(lab, cfg, trainer=())
    rows = {row["label"]: row for row in page["rows"]}
    rope = rows["rope"]
    assert page["seeds"] == [0, 1] and rope["status"] is None
    assert list(rope["values"]) == ["ppl 1x", "ppl 2x", "ppl 4x", "ppl 8x", "ppl 16x", "train tok/s"]
    assert rope["values"]["train tok/s"] == [2000.0, 2000.5]  # each run's median
    assert all(len(v) == 2 and None not in v for v in rope["values"].values())
    ppl = rope["values"]["ppl 1x"]
    summary = rope["summary"]["ppl 1x"]
    assert summary["mean"] == pytest.approx(sum(ppl) / 2) and summary["low"] < min(ppl)
    # The zero-shot row evaluates the RoPE runs again, under YaRN; it trained nothing.
    assert "train tok/s" not in rows["rope+yarn4"]["values"]
    yarn4 = json.loads((runs / "rope" / "seed0" / "length_eval_yarn4.json").read_text())
    assert yarn4["rope_scaling"]["factor"] == 4
    # The stopped run is shown with its step, its values kept out of the summary and of every claim.
    assert rows["alibi"]["status"] == "unfinished: seed 1 at step 40 of 100"
    assert rows["alibi"]["values"]["ppl 1x"][1] is None and rows["alibi"]["summary"]["ppl 1x"]["n"] == 1
    findings = {(f["better"], f["worse"]): f["verdict"] for f in page["findings"]}
    assert findings[("alibi", "rope")].startswith("inconclusive (unfinished")
    assert findings[("alibi", "sinusoidal")] == "not measured"
    # By default the page lands beside the runs, and renders from its JSON.
    assert json.loads((runs / "extrapolation.json").read_text()) == {**page, "figure": "extrapolation.png"}
    text = (runs / "extrapolation.md").read_text()
    assert "| alibi | unfinished: seed 1 at step 40 of 100 | — |" in text
    assert (runs / "extrapolation.png").stat().st_size > 10_000
    assert "lab done in" in capsys.readouterr().out


def test_the_attention_lab_prices_each_variant(prepared, tmp_path):
    names = ("plain", "mla", "sinks")
    lab = dataclasses.replace(LABS["attention"], rows=lambda cfg: [Row(name, name) for name in names])
    runs = tmp_path / "runs"
    save_run(runs / "plain" / "seed0", prepared, seed=0)
    save_run(runs / "mla" / "seed0", prepared, seed=0, mla_kv_rank=8, mla_rope_dim=4, n_kv_head=4)
    save_run(runs / "sinks" / "seed0", prepared, seed=0, attn_sinks=True)
    published = tmp_path / "published"  # out= puts the page elsewhere than beside the runs
    cfg = AttentionLabConfig(runs_root=str(runs), seeds=[0], max_tokens=256, out=str(published))
    page = run_lab(lab, cfg, trainer=())
    assert (published / "attention.md").is_file() and not (runs / "attention.md").exists()
    rows = {row["label"]: row["values"] for row in page["rows"]}
    # float32 per token, both layers: 2 x (K + V) x 2 K/V heads x 8 dims x 4 bytes = 256; the latent:
    # 2 layers x (rank 8 + rope dim 4) x 4 bytes = 96.
    assert rows["plain"]["KV bytes/token"] == [256] and rows["mla"]["KV bytes/token"] == [96]
    assert rows["plain"]["max logit"] == [7.5]
    # A variant's own statistic, here the mass the sinks take; the plain block has none.
    assert "own stat" not in rows["plain"] and 0 < rows["sinks"]["own stat"][0] < 1


def test_a_lab_with_its_defaults_writes_only_under_the_ignored_runs_folder(prepared, tmp_path, monkeypatch):
    lab = dataclasses.replace(LABS["attention"], rows=lambda cfg: [Row("plain", "plain")])
    monkeypatch.chdir(tmp_path)  # runs/ is relative to where the lab runs, as in a checkout's root
    save_run(tmp_path / "runs" / "attention" / "plain" / "seed0", prepared, seed=0)
    run_lab(lab, AttentionLabConfig(seeds=[0], max_tokens=256), trainer=())
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()
                     and not str(p.relative_to(tmp_path)).startswith("runs/attention/plain/"))
    assert written == [f"runs/attention/attention.{ext}" for ext in ("json", "md", "png")]
    # In a checkout those paths are git-ignored, so `git status` stays clean.
    ignored = subprocess.run(["git", "check-ignore", *written], cwd=REPO, capture_output=True, text=True)
    assert ignored.returncode == 0 and ignored.stdout.split() == written


def test_a_run_stopped_at_its_accuracy_is_finished_and_one_cut_short_at_that_step_is_not(prepared, tmp_path):
    def run(name, target, **measured):
        return save_run(tmp_path / name, prepared, seed=0, step=40, last=100, stop_at_accuracy=target,
                        measured=measured)

    assert is_finished(run("reached", 0.95, exact_1x=0.97))
    assert not is_finished(run("killed", 0.95))  # stopped by a signal between evaluations
    assert not is_finished(run("below", 0.95, exact_1x=0.9))  # an evaluation, then a kill
    assert not is_finished(run("raised", 0.99, exact_1x=0.97))  # resumed with a higher target
    assert not is_finished(run("no_target", None, exact_1x=0.97))
    assert is_finished(save_run(tmp_path / "budget", prepared, seed=0, step=100, last=100))


def test_the_budget_calibration_gives_each_rows_steps_and_the_budget_from_the_slowest(prepared, tmp_path):
    runs = tmp_path / "runs"
    for name, step, exact in (("copy/nope", 300, 0.97), ("copy/rope", 200, 0.99),
                              ("addition/nope", 10_000, 0.4), ("addition/rope", 1_800, 0.96)):
        save_run(runs / name / "seed0", prepared, seed=0, step=step, last=10_000, stop_at_accuracy=0.95,
                 measured={"exact_1x": exact})
    cfg = TaskLabConfig(calibrate="task_budget", tasks=["copy", "addition"], encodings=["nope", "rope"],
                        seeds=[0], runs_root=str(runs))
    page = task_lab(cfg, trainer=())
    rows = {row["label"]: row for row in page["rows"]}
    assert page["page"] == "task_budget" and rows["copy/rope"]["values"]["steps"] == [200]
    assert rows["addition/nope"]["status"] == "not learned in 10,000 steps (0.40 at 1x)"
    assert page["notes"] == ["**Budget: 2 × 1,800 steps (addition/rope, the slowest to learn) = 3,600 "
                             "steps**, the task lab's `train.max_steps` (`configs/experiment/tasks.yaml`)."]
    assert page["notes"][0] in (runs / "task_budget.md").read_text()
    # Each run's two log windows of 1,000 tokens, at 1,000 and 3,000 tokens/s: 4/3 s of training.
    assert (page["trained_runs"], page["training_seconds"]) == (4, pytest.approx(4 * 4 / 3))
    assert "- training: 0.1 minutes over its 4 runs" in (runs / "task_budget.md").read_text()


def test_the_addition_calibration_scores_operands_of_exactly_one_two_and_three_digits():
    assert size_bins(3, DIGIT_FACTORS) == [(1, 1), (2, 2), (3, 3)]
    assert [row.train for row in LABS["addition_calibration"].rows(TaskLabConfig())] == [
        ("task=addition", "pos=learned")]
