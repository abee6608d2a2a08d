"""The labs' driver: rows over seeds, finished runs only, a results page in runs/<lab>/ by default."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_docs import LAB_CONFIGS  # each lab's config at its defaults

from nanoattn import GPT, ModelConfig
from nanoattn.checkpoint import save_checkpoint
from nanoattn.commands.labs import (
    ARITHMETIC_ROWS,
    CONTROL_BUDGETS,
    DIGIT_FACTORS,
    LABS,
    ArithmeticLabConfig,
    AttentionLabConfig,
    Lab,
    LabConfig,
    Quick,
    Row,
    TaskLabConfig,
    is_finished,
    lab_jobs,
    run_lab,
    task_lab,
)
from nanoattn.commands.labs.driver import quick_config
from nanoattn.commands.labs.scales import WEB_CORPUS, at_scale
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.eval.tasks import size_bins

REPO = Path(__file__).resolve().parents[2]


def tiny_runs(prepared: Path) -> list[str]:
    """Training overrides over any lab's experiment: a tiny model on the prepared corpus."""
    docs = prepared.parents[1] / "docs"
    return ["model.d_model=32", "model.n_layer=2", "model.n_head=4", "model.n_kv_head=2", "model.d_ff=64",
            "model.max_seq_len=16", "data=text", f"data.name={prepared.name}", f"data.root={prepared.parent}",
            f"data.paths=[{docs}]", "data.tokenizer.type=byte", "train.max_steps=100"]


def save_run(run: Path, trainer, overrides, *, step: int | None = None, measured: dict | None = None) -> Path:
    """A run directory as training leaves it: the config its command's ``overrides`` train, a
    checkpoint of that model at ``step`` (default: the last, as a finished run), metrics."""
    config = {**trainer.resolve(overrides), "out_dir": str(run)}
    torch.manual_seed(config["train"]["seed"])
    model = GPT(ModelConfig.from_dict(config["model"])).eval()
    step = config["train"]["max_steps"] if step is None else step
    data = Path(config["data"]["root"]) / config["data"]["name"]
    save_checkpoint(run / "checkpoints", f"{step:06d}", model, train_seq_len=16, step=step,
                    tokenizer_file=data / "tokenizer.json", measured=measured)
    (run / "config.yaml").write_text(yaml.safe_dump(config))
    seed = config["train"]["seed"]
    records = [{"step": 10, "tokens": 1000, "tok_per_s": 1000.0 + seed},
               {"step": 20, "tokens": 2000, "tok_per_s": 3000.0, "max_attn_logit": 7.5}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def save_lab_runs(lab: Lab, cfg, trainer, steps: dict[Path, int] | None = None) -> dict[Path, list[str]]:
    """Every run ``lab`` trains under ``cfg``, saved by ``save_run`` (at ``steps[run]`` where given);
    returns the runs with their overrides."""
    jobs = lab_jobs(lab, cfg, lab.rows(cfg), Path(cfg.runs_root))
    for run, overrides in jobs.items():
        save_run(run, trainer, overrides, step=(steps or {}).get(run))
    return jobs


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


def test_the_control_budget_trains_the_arithmetic_labs_control_at_each_shape_and_budget():
    rows = {row.label: row.train for row in LABS["control_budget"].rows(ArithmeticLabConfig(
        calibrate="control_budget"))}
    assert list(rows) == list(CONTROL_BUDGETS)
    for name, train in rows.items():
        # The control's own overrides, the authors' coupled-id range for 5 digits, then the budget.
        assert train == (*ARITHMETIC_ROWS["coupling_paper"], "task.max_position=17", *CONTROL_BUDGETS[name],
                         "task.train_length=5")
    assert "train.max_steps=10000" in rows["d128_b128_10k"] and "train.batch_size=256" in rows["d256_b256_3k"]
    with pytest.raises(ValueError, match=r"^arithmetic_lab\.digits=3 is invalid: calibrate=control_budget "
                                         r"trains the authors' block of 5 digits$"):
        ArithmeticLabConfig(calibrate="control_budget", digits=3)
    with pytest.raises(ValueError, match=r"^arithmetic_lab\.calibrate='task_budget' is invalid: allowed: "
                                         r"control_budget$"):
        ArithmeticLabConfig(calibrate="task_budget")


def test_the_control_budget_page_names_the_best_row_at_2x_and_the_authors_budget():
    notes = LABS["control_budget"].notes
    values = {"small": {"exact 1x": [1.0], "exact 2x": [0.5], "additions": [400_000]},
              "large": {"exact 1x": [1.0], "exact 2x": [0.92], "additions": [5_000_000]},
              "unlearned": {"exact 1x": [0.3], "exact 2x": [0.99], "additions": [100]}}
    assert notes(values) == [
        "**Best at 2D digits: large, exact match 0.920**, which reaches the arithmetic lab's bar of 0.9.",
        "Cho et al.'s smallest reported run trained on 50,000,000 additions, 10x this page's largest "
        "(5,000,000)."]
    values["large"]["exact 2x"] = [0.84]
    assert "which stays below the arithmetic lab's bar of 0.9" in notes(values)[0]


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


def test_every_lab_has_a_quick_form_of_its_own_rows_at_one_seed_in_a_runs_folder_of_its_own():
    for name, cfg in LAB_CONFIGS.items():
        lab = LABS[name]
        quick = quick_config(lab, dataclasses.replace(cfg, quick=True))
        assert quick.seeds == [0] and quick.runs_root == f"runs/{name}_quick", name
        assert set(lab.quick.rows) <= {row.label for row in lab.rows(quick)}, name
        assert quick.train_overrides == list(lab.quick.train) and lab.quick.train, name
        assert all(getattr(quick, key) == value for key, value in lab.quick.keys.items())
    # The command's own training overrides come after the quick form's, so they win.
    given = AttentionLabConfig(quick=True, train_overrides=["train.max_steps=7"])
    assert quick_config(LABS["attention"], given).train_overrides[-1] == "train.max_steps=7"
    with pytest.raises(ValueError, match=r"^attention_lab.out='docs/results' is invalid: must be null with "
                                         r"quick=true \(a quick page is a first look"):
        AttentionLabConfig(quick=True, out="docs/results")


def test_every_lab_at_the_gpu_scale_trains_its_rows_at_the_gpt2_small_shape_apart(trainer, tmp_path):
    for name, cfg in LAB_CONFIGS.items():
        lab = at_scale(LABS[name], "gpu")
        assert lab.name == f"{name}_gpu" and (lab.experiment or name) == (LABS[name].experiment or name)
        rows = lab.rows(cfg)[:2]
        jobs = lab_jobs(lab, dataclasses.replace(cfg, scale="gpu"), rows, tmp_path / lab.name)
        web = name in ("extrapolation", "passkey", "attention")
        for overrides in jobs.values():
            corpus = [o for o in overrides if o.startswith("data")]
            assert corpus == ([o for o in WEB_CORPUS if o.startswith("data")] if web else []), name
            # Resolving prepares the data, and the web corpus needs a network: the model and the
            # training are resolved on the lab's own corpus.
            if name == "passkey":  # it resolves the extrapolation run it starts from, which is not here
                assert any(o.startswith("train.init_from=runs/extrapolation_gpu/") for o in overrides)
                continue
            run = trainer.resolve([o for o in overrides if o not in corpus])
            assert (run["model"]["d_model"], run["model"]["n_layer"], run["model"]["n_head"]) == (768, 12, 12)
            assert run["train"]["device"] == "cuda" and run["train"]["dtype"] == "bfloat16"
            assert (run["train"]["seq_len"] == 1024) == web, name
        plain = lab_jobs(LABS[name], cfg, rows, tmp_path / name)  # the CPU scale is the lab as it was
        assert all("train.device=cuda" not in overrides for overrides in plain.values())
    assert LabConfig(passkey=True, scale="gpu").starting_root() == Path("runs/extrapolation_gpu")
    assert at_scale(LABS["passkey"], "gpu").starts_from == "extrapolation_gpu"
    with pytest.raises(ValueError, match=r"^attention_lab.scale='tpu' is invalid: allowed: cpu \| gpu$"):
        AttentionLabConfig(scale="tpu")


def test_training_a_lab_at_the_gpu_scale_without_cuda_is_refused_before_anything_trains(tmp_path, trainer,
                                                                                       monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cfg = AttentionLabConfig(scale="gpu", train=True, runs_root=str(tmp_path / "runs"))
    with pytest.raises(ValueError, match=r"^attention_lab.scale=.gpu. is invalid here: it trains on a CUDA"):
        run_lab(LABS["attention"], cfg, trainer)
    assert not (tmp_path / "runs").exists()


def test_a_quick_lab_evaluates_its_quick_rows_only(prepared, tmp_path, trainer):
    lab = dataclasses.replace(LABS["extrapolation"], rows=lambda cfg: ROWS,
                              quick=Quick(("alibi",), ("train.max_steps=50",), {"max_tokens": 128}))
    cfg = LabConfig(quick=True, runs_root=str(tmp_path / "runs"), train_overrides=tiny_runs(prepared))
    save_lab_runs(lab, quick_config(lab, cfg), trainer)
    page = run_lab(lab, cfg, trainer)
    assert [row["label"] for row in page["rows"]] == ["alibi"] and page["seeds"] == [0]
    assert page["not_run"] == ["rope", "rope+yarn4"]


def test_a_lab_publishes_every_seed_with_intervals_and_never_an_unfinished_run(prepared, tmp_path, capsys,
                                                                              trainer):
    lab = dataclasses.replace(LABS["extrapolation"], rows=lambda cfg: ROWS)
    runs = tmp_path / "runs"
    cfg = LabConfig(runs_root=str(runs), seeds=[0, 1], max_tokens=256, train_overrides=tiny_runs(prepared))
    jobs = lab_jobs(lab, cfg, ROWS, runs)
    for run in (runs / "rope" / "seed0", runs / "rope" / "seed1", runs / "alibi" / "seed0"):
        save_run(run, trainer, jobs[run])
    with pytest.raises(ValueError, match=r"^no run directory .*alibi/seed1 \(and 0 more\); run the lab with"):
        run_lab(lab, cfg, trainer)
    save_run(runs / "alibi" / "seed1", trainer, jobs[runs / "alibi" / "seed1"], step=40)  # 40 of 100 steps
    page = run_lab(lab, cfg, trainer)
    rows = {row["label"]: row for row in page["rows"]}
    rope = rows["rope"]
    assert page["seeds"] == [0, 1] and rope["status"] is None
    # Beside the levels, the changes from 1x its length claims are judged on.
    assert list(rope["values"]) == ["ppl 1x", "ppl 2x", "ppl 4x", "ppl 8x", "ppl 16x",
                                    "ppl 16x / 1x", "ppl 4x / 1x"]
    level, base = rope["values"]["ppl 16x"], rope["values"]["ppl 1x"]
    assert rope["values"]["ppl 16x / 1x"] == [pytest.approx(s / o) for s, o in zip(level, base, strict=True)]
    assert all(len(v) == 2 and None not in v for v in rope["values"].values())
    ppl = rope["values"]["ppl 1x"]
    summary = rope["summary"]["ppl 1x"]
    assert summary["mean"] == pytest.approx(sum(ppl) / 2) and summary["low"] < min(ppl)
    # The zero-shot row evaluates the RoPE runs again, under YaRN; it trained nothing.
    assert list(rows["rope+yarn4"]["values"]) == list(rope["values"])
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


def test_the_attention_lab_prices_each_variant(prepared, tmp_path, trainer):
    rows = [Row("plain", "plain", ("attention=plain",)), Row("sinks", "sinks", ("attention=sinks",)),
            Row("mla", "mla", ("attention=mla", "model.mla_kv_rank=8", "model.mla_rope_dim=4"))]
    lab = dataclasses.replace(LABS["attention"], rows=lambda cfg: rows)
    runs = tmp_path / "runs"
    published = tmp_path / "published"  # out= puts the page elsewhere than beside the runs
    mha = [o for o in tiny_runs(prepared) if not o.startswith("model.n_kv_head=")]  # latent attention's
    cfg = AttentionLabConfig(runs_root=str(runs), seeds=[0], max_tokens=256, out=str(published),
                             train_overrides=mha)
    save_lab_runs(lab, cfg, trainer)
    page = run_lab(lab, cfg, trainer)
    assert (published / "attention.md").is_file() and not (runs / "attention.md").exists()
    rows = {row["label"]: row["values"] for row in page["rows"]}
    # float32 per token, both layers: 2 x (K + V) x 4 K/V heads x 8 dims x 4 bytes = 512; the latent:
    # 2 layers x (rank 8 + rope dim 4) x 4 bytes = 96.
    assert rows["plain"]["KV bytes/token"] == [512] and rows["mla"]["KV bytes/token"] == [96]
    assert rows["plain"]["max logit"] == [7.5]
    # A variant's own statistic, here the mass the sinks take; the plain block has none.
    assert "own stat" not in rows["plain"] and 0 < rows["sinks"]["own stat"][0] < 1


def test_a_lab_with_its_defaults_writes_only_under_the_ignored_runs_folder(prepared, tmp_path, monkeypatch,
                                                                          trainer):
    plain = Row("plain", "plain", ("attention=plain",))
    lab = dataclasses.replace(LABS["attention"], rows=lambda cfg: [plain])
    monkeypatch.chdir(tmp_path)  # runs/ is relative to where the lab runs, as in a checkout's root
    cfg = AttentionLabConfig(seeds=[0], max_tokens=256, train_overrides=tiny_runs(prepared))
    save_lab_runs(lab, dataclasses.replace(cfg, runs_root="runs/attention"), trainer)
    run_lab(lab, cfg, trainer)
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()
                     and not str(p.relative_to(tmp_path)).startswith("runs/attention/plain/"))
    assert written == [f"runs/attention/attention.{ext}" for ext in ("json", "md", "png")]
    # In a checkout those paths are git-ignored, so `git status` stays clean.
    ignored = subprocess.run(["git", "check-ignore", *written], cwd=REPO, capture_output=True, text=True)
    assert ignored.returncode == 0 and ignored.stdout.split() == written


def test_a_run_stopped_at_its_accuracy_is_finished_and_one_cut_short_at_that_step_is_not(prepared, tmp_path,
                                                                                         trainer):
    task = ["experiment=tasks", "task=copy", "pos=nope", *tiny_runs(prepared)]

    def run(name, target, **measured):
        return save_run(tmp_path / name, trainer, [*task, f"train.stop_at_accuracy={target}"], step=40,
                        measured=measured)

    assert is_finished(run("reached", 0.95, exact_1x=0.97))
    assert not is_finished(run("killed", 0.95))  # stopped by a signal between evaluations
    assert not is_finished(run("below", 0.95, exact_1x=0.9))  # an evaluation, then a kill
    assert not is_finished(run("raised", 0.99, exact_1x=0.97))  # resumed with a higher target
    assert not is_finished(run("no_target", "null", exact_1x=0.97))
    assert is_finished(save_run(tmp_path / "budget", trainer, task))


def test_a_lab_never_uses_a_run_of_other_settings_nor_mixes_them_in_a_row(prepared, tmp_path, trainer):
    """A run counts only as its command's run: the same lab at other settings (here the model's width
    and the steps) refuses the runs, naming a key, rather than publishing their values under its own
    command; and a row's seeds must agree (one seed trained 10 steps, the other the lab's 100)."""
    lab = dataclasses.replace(LABS["extrapolation"], rows=lambda cfg: ROWS[:1])
    runs = tmp_path / "runs"
    cfg = LabConfig(runs_root=str(runs), seeds=[0, 1], max_tokens=256, train_overrides=tiny_runs(prepared))
    save_lab_runs(lab, cfg, trainer)
    wider = dataclasses.replace(cfg, train_overrides=[*cfg.train_overrides, "model.d_model=64",
                                                      "train.max_steps=30"])
    with pytest.raises(ValueError, match=r"^\S*/rope/seed0 holds a run of other settings than this lab's \("
                                         r"model.d_model=32 there, 64 now; \+1 more\): a lab never uses it"):
        run_lab(lab, wider, trainer)
    seed1 = runs / "rope" / "seed1"
    shutil.rmtree(seed1)
    save_run(seed1, trainer, [*lab_jobs(lab, cfg, ROWS[:1], runs)[seed1], "train.max_steps=10"])
    with pytest.raises(ValueError, match=r"/rope/seed1 holds a run of other settings than this lab's "
                                         r"\(train.max_steps=10 there, 100 now\)"):
        run_lab(lab, cfg, trainer)
    assert not (runs / "extrapolation.json").exists()


def test_the_budget_calibration_gives_each_rows_steps_and_the_budget_from_the_slowest(prepared, tmp_path,
                                                                                      trainer):
    runs = tmp_path / "runs"
    cfg = TaskLabConfig(calibrate="task_budget", tasks=["copy", "addition"], encodings=["nope", "rope"],
                        seeds=[0], runs_root=str(runs),
                        train_overrides=[*tiny_runs(prepared), "train.max_steps=10000"])
    lab = LABS["task_budget"]
    jobs = lab_jobs(lab, cfg, lab.rows(cfg), runs)
    # Stopped where each reached the stop bar (0.99), or at the cap.
    for name, step, exact in (("copy/nope", 300, 0.995), ("copy/rope", 200, 0.999),
                              ("addition/nope", 10_000, 0.4), ("addition/rope", 1_800, 0.992)):
        save_run(runs / name / "seed0", trainer, jobs[runs / name / "seed0"], step=step,
                 measured={"exact_1x": exact})
    page = task_lab(cfg, trainer)
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


# The lab script, started when both processes are ready, so that they reach their lab at once.
LAB_TOGETHER = """
import os, runpy, sys, time
from pathlib import Path
meeting, script = Path(sys.argv[1]), sys.argv[2]
(meeting / f"ready{os.getpid()}").touch()
deadline = time.monotonic() + 60
while len(list(meeting.glob("ready*"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
sys.argv = [script, *sys.argv[3:]]
sys.path.insert(0, str(Path(script).parent))  # as running the script puts its folder first
runpy.run_path(script, run_name="__main__")
"""


def test_two_labs_at_once_in_one_runs_folder_publish_one_complete_page_and_refuse_the_other(
        prepared, tmp_path, trainer):
    """rows=[nope] and rows=[abacus] of the arithmetic lab into one runs folder at once: both wrote the
    page before (it held one row); now one publishes its page whole and the other refuses in one line."""
    runs, meeting = tmp_path / "runs", tmp_path / "meeting"
    meeting.mkdir()
    common = dict(digits=2, factors=[1], per_bin=8, seeds=[0], runs_root=str(runs),
                  train_overrides=tiny_runs(prepared))
    save_lab_runs(LABS["arithmetic"], ArithmeticLabConfig(rows=["nope", "abacus"], **common), trainer)
    arguments = [f"{key}={json.dumps(value)}" for key, value in common.items()]
    processes = [subprocess.Popen([sys.executable, "-c", LAB_TOGETHER, str(meeting),
                                   str(REPO / "scripts" / "arithmetic_lab.py"), f"rows=[{row}]", *arguments],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for row in ("nope", "abacus")]
    outcomes = [(process.wait(timeout=240), process.stderr.read()) for process in processes]
    (published,) = [row for (code, _), row in zip(outcomes, ("nope", "abacus"), strict=True) if code == 0]
    (refused,) = [err for code, err in outcomes if code != 0]
    assert refused.strip().splitlines()[-1].startswith(
        f"error: the runs folder {runs} (another lab) is in use by process ")
    page = json.loads((runs / "arithmetic.json").read_text())
    assert [row["label"] for row in page["rows"]] == [published]
    assert f"'rows=[{published}]'" in page["command"].split()


def test_every_output_is_checked_before_any_work(prepared, tmp_path, trainer):
    """A page folder that is a file, or the repository's root, is refused before a run trains (it failed
    after training and evaluation before); so is a passkey lab whose starting run is unfinished."""
    (tmp_path / "page").write_text("a file")
    trains_nothing = trainer._replace(command=[sys.executable, "-c", "raise SystemExit('trained')"])
    for out, refusal in ((tmp_path / "page", f"^extrapolation_lab.out {str(tmp_path / 'page')!r} is a file"),
                         (REPO, "^extrapolation_lab.out=.* is invalid: it is the root of the repository")):
        with pytest.raises(ValueError, match=refusal):
            run_lab(LABS["extrapolation"], LabConfig(out=str(out), train=True,
                                                     runs_root=str(tmp_path / "runs")), trains_nothing)
    init_root = tmp_path / "extrapolation"
    cfg = LabConfig(passkey=True, seeds=[0], train=True, init_root=str(init_root),
                    runs_root=str(tmp_path / "pk"), train_overrides=tiny_runs(prepared))
    start = init_root / "sinusoidal" / "seed0"
    save_run(start, trainer, ["experiment=extrapolation", "pos=sinusoidal", *tiny_runs(prepared)], step=40)
    with pytest.raises(ValueError, match=f"^extrapolation_lab: {start}, which sinusoidal's seed 0 starts "
                                         "from, is at step 40 of 100: train the extrapolation lab first"):
        run_lab(LABS["passkey"], cfg, trains_nothing)
