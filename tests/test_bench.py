"""The benchmark's code paths on tiny shapes: what each section compares, never how fast it is.

Speed is only ever measured by ``scripts/bench.py``; these tests check that the comparisons are
of like with like (the same loss from both implementations, identical greedy tokens, the training
loop's own step), that every section, the config and the command line run, and that mistakes
are one-line errors naming the key.
"""

from __future__ import annotations

import dataclasses
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

import nanoattn.bench.e2e
import nanoattn.bench.labs
import nanoattn.bench.train
from nanoattn import GPT, kernels
from nanoattn.bench import (
    EVAL_POSITIONS,
    SECTIONS,
    BenchConfig,
    format_table,
    read_run_rate,
    run_bench,
    run_sections,
)
from nanoattn.bench.bare import IMPLEMENTED, PLAIN, BareGPT
from nanoattn.bench.core import DEFAULT_RECIPE, shape_text
from nanoattn.bench.labs import LAB_JOBS, job_order
from nanoattn.bench.speedrun import recipe, scores, time_to, training_curve, value_at
from nanoattn.bench.train import TwinLoss, training_twin
from nanoattn.bench.variants import bench_attention
from nanoattn.config import ModelConfig, RunConfig, preset
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.train import step
from nanoattn.validation import from_dict

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from _hydra_cli import register_schema  # noqa: E402  (scripts/ is not a package)

# 4 layers: the deepest registry options (the iRoPE layout, two value tables) fit.
TINY = dict(vocab_size=96, d_model=32, n_layer=4, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=16)


def tiny_config(**overrides) -> BenchConfig:
    values = dict(quick=True, reps=1, model=ModelConfig(**TINY, tie_embeddings=False), batch_size=2,
                  seq_len=16, decode_model=ModelConfig(**{**TINY, "n_layer": 2}), e2e_seconds=0.0)
    return BenchConfig(**{**values, **overrides})


def write_run(run: Path, rates: list[float]) -> None:
    """A run directory as scripts/train.py writes it: config.yaml and one metrics record per window."""
    cfg = RunConfig(model=ModelConfig(**TINY), train={"batch_size": 2, "seq_len": 16, "grad_accum": 2,
                                                      "dtype": "float32", "grad_clip": 0.5})
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    records = [{"step": 10 * (i + 1), "train_loss": 4.0, "lr": 1e-3, "tokens": 640 * (i + 1), "tok_per_s": r}
               for i, r in enumerate(rates)]
    records[2].update(val_loss=4.1, val_bpb=2.0)  # an evaluation window's record is a train record too
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def distinct_times(monkeypatch) -> None:
    """The timed sections run every step as before, then report made-up times, all different
    (1, 2, 3 ... ms in the order timed): a ratio taken against the wrong row cannot come out right."""
    def alternate(fns, reps, device, warmup=1):
        nanoattn.bench.core.alternate(fns, reps, device, warmup)
        return {name: (i + 1) / 1000 for i, name in enumerate(fns)}

    for module in (nanoattn.bench.train, nanoattn.bench.variants):
        monkeypatch.setattr(module, "alternate", alternate)


def test_every_section_runs_and_compares_like_with_like(tmp_path, monkeypatch):
    distinct_times(monkeypatch)
    write_run(tmp_path / "run", [10.0, 500.0, 300.0, 400.0])
    rows = run_sections(["train", "mfu", "decode", "eval", "e2e", "encodings", "attention"],
                        tiny_config(run=str(tmp_path / "run")))

    train = rows["train"]
    assert [(r["impl"], r["dtype"]) for r in train] == [(impl, dtype) for dtype in ("float32", "bfloat16")
                                                         for impl in ("nanoattn", "transformers", "bare")]
    # The exported twin and the bare reference have our weights, so all compute the same loss.
    assert train[0]["initial_loss"] == pytest.approx(train[1]["initial_loss"], rel=1e-5)
    assert train[0]["initial_loss"] == pytest.approx(train[2]["initial_loss"], rel=1e-5)
    # Each rate is a ratio to the transformers and the bare rows of its own dtype.
    for dtype in ("float32", "bfloat16"):
        ms = {r["impl"]: r["step_ms"] for r in train if r["dtype"] == dtype}
        assert len(set(ms.values())) == 3
        for r in (r for r in train if r["dtype"] == dtype):
            assert r["tok_per_s"] == pytest.approx(2 * 16 / (r["step_ms"] / 1000))
            assert r["vs_bare"] == pytest.approx(ms["bare"] / r["step_ms"])
            assert r["vs_transformers"] == pytest.approx(ms["transformers"] / r["step_ms"])
    assert "vs_transformers" in format_table(train).splitlines()[0]

    mfu = rows["mfu"]
    assert [(r["impl"], r["dtype"]) for r in mfu[:2]] == [("matmul 1024^3", "float32"),
                                                          ("matmul 1024^3", "bfloat16")]
    peak = {r["dtype"]: r["gflop_per_s"] for r in mfu[:2]}
    assert [(r["impl"], r["dtype"]) for r in mfu[2:]] == [(r["impl"], r["dtype"]) for r in train]
    for r, timed in zip(mfu[2:], train, strict=True):  # each train row's FLOP/s over its dtype's peak
        assert r["gflop_per_s"] == pytest.approx(timed["flops_per_token"] * timed["tok_per_s"] / 1e9)
        assert r["mfu"] == pytest.approx(r["gflop_per_s"] / peak[r["dtype"]])

    decode = rows["decode"]
    greedy = [(r["model"], r["impl"], r["batch"], r["same_tokens"])
              for r in decode if r["impl"].endswith("greedy")]
    # At both bench shapes: decode_model's (two layers here), then the train section's model's (four).
    assert greedy == [(f"d32 L{layers} H4/2 ff64 V96 (random)", impl, batch, True) for layers in (2, 4)
                      for batch in (1, 8) for impl in ("nanoattn greedy", "transformers greedy")]
    kv_bytes = {r["layout"]: r["kv_cache_bytes"] for r in decode if r["model"].startswith("same shape")}
    assert kv_bytes["MHA"] == 2 * kv_bytes["GQA-2"] == 4 * kv_bytes["MQA"]  # shrinks by n_head / n_kv_head

    evaluation = rows["eval"]
    assert sorted({r["pos"] for r in evaluation}) == sorted(EVAL_POSITIONS)
    assert [r["multiple"] for r in evaluation if r["pos"] == "learned"] == [1]  # nothing past its table
    assert [r["length"] for r in evaluation if r["pos"] == "rope"] == [64, 256, 1024]  # quick: 1x = 64

    encodings = rows["encodings"]
    assert [r["pos"] for r in encodings] == list(encoding_options())
    rope = next(r["step_ms"] for r in encodings if r["pos"] == "rope")
    assert all(r["vs_rope"] == pytest.approx(rope / r["step_ms"]) for r in encodings)
    assert all(r["shape"].endswith("T64") for r in encodings)  # quick: T = 64

    attention = rows["attention"]
    assert [r["variant"] for r in attention] == list(bench_attention())
    plain = next(r["step_ms"] for r in attention if r["variant"] == "plain")
    assert all(r["vs_plain"] == pytest.approx(plain / r["step_ms"]) for r in attention)

    [e2e] = rows["e2e"]
    assert e2e["shape"].endswith("B4 T16")  # batch_size x grad_accum sequences per optimizer step
    assert e2e["script_tok_per_s"] == 400.0
    assert e2e["script_vs_step"] == pytest.approx(400.0 / e2e["step_tok_per_s"])


def test_train_and_e2e_time_the_training_loops_own_step(tmp_path, monkeypatch):
    """Both call nanoattn.train.step.optimizer_step; e2e with the run's micro-batches and clipping."""
    calls = []

    def spy(net, model, optimizer, micro_batches, **options):
        calls.append((tuple(tuple(x.shape) for x, _ in micro_batches), options["grad_clip"], type(net)))
        return step.optimizer_step(net, model, optimizer, micro_batches, **options)

    for module in (nanoattn.bench.train, nanoattn.bench.e2e):
        monkeypatch.setattr(module, "optimizer_step", spy)
    write_run(tmp_path / "run", [10.0, 500.0, 300.0, 400.0])
    run_sections(["e2e"], tiny_config(run=str(tmp_path / "run")))
    # The net is wrap_for_training's, as in the loop; 2 micro-batches of [2, 16], the run's grad_clip.
    assert calls and set(calls) == {(((2, 16), (2, 16)), 0.5, step.LossModule)}
    calls.clear()
    run_sections(["train"], tiny_config())
    assert {net.__name__ for _, _, net in calls} == {"LossModule", "TwinLoss", "BareGPT"}


def test_train_steps_all_three_with_the_recipes_optimizer(monkeypatch):
    """By default the default run's: Muon over the same block matrices in each implementation
    (transformers splits them into more), AdamW for the rest; ``train_recipe=[]``: the first round's AdamW."""
    stepped = {}

    def spy(net, model, optimizer, micro_batches, **options):
        stepped[type(net).__name__] = (model, optimizer)
        return step.optimizer_step(net, model, optimizer, micro_batches, **options)

    monkeypatch.setattr(nanoattn.bench.train, "optimizer_step", spy)
    rows = run_sections(["train"], tiny_config(model=ModelConfig(**TINY)))["train"]
    assert {r["optimizer"] for r in rows} == {"muon"}
    muon_weights = {}
    for net, (model, optimizer) in stepped.items():
        muon, adamw = optimizer.optimizers
        matrices = {id(p) for group in muon.param_groups for p in group["params"]}
        rest = {id(p) for group in adamw.param_groups for p in group["params"]}
        assert id(model.lm_head.weight) in rest - matrices  # untied by the recipe, stepped by AdamW
        assert {id(p) for p in model.parameters()} == matrices | rest
        muon_weights[net] = sum(p.numel() for group in muon.param_groups for p in group["params"])
    assert muon_weights["LossModule"] == muon_weights["TwinLoss"] == muon_weights["BareGPT"]
    stepped.clear()
    rows = run_sections(["train"], tiny_config(train_recipe=[]))["train"]
    assert {r["optimizer"] for r in rows} == {"adamw"}
    assert all(isinstance(optimizer, torch.optim.AdamW) for _, optimizer in stepped.values())


def test_profile_splits_the_recipes_step_by_kind_of_work(fresh_attention_timings, monkeypatch, capfd):
    """The default run's step (Muon) unless train_recipe says otherwise; every op's time counted once.
    SDPA's kernel is a kind of its own; in bf16 on CPU the default kernel choice, where timed faster
    (here made the answer), is matmuls and a softmax."""
    monkeypatch.setattr(kernels, "fastest_kernel", lambda what, shape, candidates: "bf16 matmuls")
    bf16 = "train.dtype=bfloat16"
    for options, optimizer in (({}, "muon"), ({"train_recipe": [bf16, *DEFAULT_RECIPE]}, "muon"),
                               ({"train_recipe": [bf16, "model.attn_kernel=sdpa"]}, "adamw")):
        rows = run_sections(["profile"], tiny_config(**options))["profile"]
        assert {r["optimizer"] for r in rows} == {optimizer}
        run = recipe(options.get("train_recipe", DEFAULT_RECIPE))  # its shape, not `model`'s
        assert {r["shape"] for r in rows} == {shape_text(run.model, run.train.batch_size, run.seq_len)}
        assert sum(r["share"] for r in rows) == pytest.approx(1.0)
        assert {"matmul", "softmax and loss", "optimizer"} <= {r["kind"] for r in rows}
        if options:
            assert ("attention" in {r["kind"] for r in rows}) == ("model.attn_kernel=sdpa" in str(options))
        assert [r["ms_per_step"] for r in rows] == sorted((r["ms_per_step"] for r in rows), reverse=True)
    assert "profiler_start" not in capfd.readouterr().err  # the profiler's own lines are not the bench's


def test_run_rate_leaves_out_the_first_window(tmp_path):
    write_run(tmp_path / "run", [10.0, 500.0, 300.0, 400.0])
    cfg, rate, windows = read_run_rate(tmp_path / "run")
    assert (cfg.train.batch_size, cfg.train.grad_accum, cfg.seq_len) == (2, 2, 16)
    assert (rate, windows) == (400.0, 3)


def test_run_rate_skips_a_torn_last_line(tmp_path):
    """A run killed while writing a record leaves half a line; the complete records still count."""
    write_run(tmp_path / "run", [10.0, 500.0, 300.0, 400.0])
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write('{"step": 50, "train_loss": 4.0, "tok_per_')
    assert read_run_rate(tmp_path / "run")[1:] == (400.0, 3)


def test_decode_without_a_transformers_counterpart_says_why():
    alibi = ModelConfig(**{**TINY, "n_layer": 1, "pos": "alibi"})
    rows = run_sections(["decode"], tiny_config(decode_model=alibi))["decode"]
    [skipped] = [r for r in rows if "comparison skipped" in r["impl"]]
    assert skipped["model"] == "d32 L1 H4/2 ff64 V96 (random)"
    assert "comparison skipped: model.pos='alibi' has no transformers counterpart" in skipped["impl"]


def test_e2e_without_a_run_is_skipped_with_a_note():
    assert "skipped" in run_sections(["e2e"], tiny_config())["e2e"][0]["note"]


def test_run_bench_writes_a_results_page_with_the_rows_and_their_settings(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    run_bench(tiny_config(only=["e2e"], out=str(tmp_path)))
    written = json.loads((tmp_path / "bench.json").read_text())
    assert written["sections"]["e2e"][0]["section"] == "e2e"
    assert (written["settings"]["only"], written["settings"]["reps"]) == (["e2e"], 1)
    assert {"threads", "load_average"} <= set(written["settings"])
    assert {"command", "commit", "dirty", "date"} <= set(written) and written["machine"]["torch"]
    page = (tmp_path / "bench.md").read_text()
    assert page.startswith("# Benchmarks\n") and "## e2e" in page and written["command"] in page
    # The folder is the page's: the command writes its two files and nothing else.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.md", "notes.txt"]
    assert "note" in capsys.readouterr().out  # the table of each section is printed as it ends


@pytest.fixture
def bench_cli_store():
    """The ConfigStore as scripts/bench.py sees it: its schema, and no ``model`` group (train's,
    registered by other tests in this process, would turn model=llama-tiny into a group choice)."""
    register_schema("bench_schema", BenchConfig)
    presets = ConfigStore.instance().repo.pop("model", None)
    yield
    if presets is not None:
        ConfigStore.instance().repo["model"] = presets


def test_the_yaml_states_no_default_and_overrides_reach_the_config(bench_cli_store):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            def build(*overrides: str) -> BenchConfig:
                values = OmegaConf.to_container(compose("bench", overrides=list(overrides)), resolve=True)
                return from_dict(BenchConfig, values, owner="bench")

            assert build() == BenchConfig()
            quick = build("only=[train,mfu]", "quick=true", "out=docs/results", "model=llama-tiny",
                          "train_recipe=[]")
            assert quick == BenchConfig(only=["train", "mfu"], quick=True, out="docs/results",
                                        model="llama-tiny", train_recipe=[])
    finally:
        GlobalHydra.instance().clear()
    # Every section runs by default but speedrun and labs (whole trainings); quick fills the repetitions
    # and e2e's time unless they are given.
    assert sorted(BenchConfig().only) == sorted(set(SECTIONS) - {"speedrun", "labs"})
    assert (quick.reps, quick.e2e_seconds, quick.model.max_seq_len) == (3, 10.0, 256)


def test_bad_options_are_one_line_errors(tmp_path, monkeypatch, bench_cli_store):
    command = [sys.executable, str(ROOT / "scripts" / "bench.py"), "only=[e2e]", f"run={tmp_path}"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == (f"error: bench.run={str(tmp_path)!r} is invalid: no "
                                                    "config.yaml (pass a run directory)\n")
    for args, message in ((["only=[nope]"], "bench.only='nope' is invalid: allowed: "),
                          (["only=[eval]", "dtype=float16"], "bench.dtype='float16' is invalid"),
                          (["model=nope"], "bench.model='nope' is invalid"),
                          (["reps=0"], "bench.reps=0 is invalid"),
                          (["speed=1"], "unknown key 'speed'")):
        monkeypatch.setattr(sys, "argv", ["bench.py", *args])
        with pytest.raises(SystemExit, match=f"^error: {message}"):
            runpy.run_path(str(ROOT / "scripts" / "bench.py"), run_name="__main__")  # main(), in process
    with pytest.raises(ValueError, match="bench.threads=0 is invalid"):
        BenchConfig(threads=0)
    with pytest.raises(ValueError, match="bench.only='speed' is invalid"):
        run_sections(["speed"], BenchConfig())


def test_speedrun_reads_time_to_target_and_the_fixed_budget_from_the_evaluations():
    records = [{"step": 10, "tokens": 1000, "tok_per_s": 100.0, "val_bpb": 3.0},  # 10 s
               {"step": 20, "tokens": 2000, "tok_per_s": 50.0},                   # +20 s (no evaluation)
               {"step": 30, "tokens": 3000, "tok_per_s": 100.0, "val_bpb": 2.0}]  # +10 s
    curve = training_curve(records)
    assert curve == [(10.0, 3.0), (40.0, 2.0)]
    assert time_to(curve, 2.5) == pytest.approx(25.0) and time_to(curve, 3.5) == 10.0
    assert time_to(curve, 1.9) is None
    assert value_at(curve, 25.0) == pytest.approx(2.5) and value_at(curve, 40.0) == 2.0
    assert value_at(curve, 41.0) is None


def test_speedrun_scores_each_run_against_the_reference_curve():
    curves = {"reference": [(50.0, 2.2), (100.0, 2.0)],              # reaches 2.1 at 75 s, ends at 100 s
              "candidate": [(20.0, 2.2), (40.0, 2.0), (120.0, 1.9)],  # reaches 2.1 at 30 s
              "slow": [(100.0, 2.3)]}                                 # never reaches it
    got = scores(curves, 2.1)
    assert got["candidate"] == {"time_to_target_s": 30.0, "speedup": pytest.approx(2.5),
                                "share_of_reference_time": pytest.approx(0.3),
                                "bpb_at_reference_budget": pytest.approx(1.925)}
    assert got["reference"]["speedup"] == 1.0 and got["reference"]["share_of_reference_time"] == 0.75
    assert got["slow"] == {"time_to_target_s": None, "speedup": None, "share_of_reference_time": None,
                           "bpb_at_reference_budget": 2.3}


def test_speedrun_recipes_are_the_first_rounds_run_with_overrides():
    run = recipe(["train.optimizer=muon", "model.qk_norm=before_rope", "train.lr=0.01"], max_steps=7)
    assert (run.train.optimizer, run.model.qk_norm, run.train.lr) == ("muon", "before_rope", 0.01)
    assert run.train.min_lr == 0.001  # lr / 10 of the overridden lr, as scripts/train.py derives it
    assert recipe(["train.min_lr=0.0002"]).train.min_lr == 0.0002
    assert run.train.max_steps == 7
    assert recipe([]) == RunConfig(model=preset("llama-tiny"))  # scripts/train.py recipe=adamw
    with pytest.raises(ValueError, match=r"override 'train.bogus=1' is invalid: expected key=value"):
        recipe(["train.bogus=1"])
    with pytest.raises(ValueError, match=r"bench.speedrun_candidate=\['muon'\] is invalid: must be a list"):
        BenchConfig(speedrun_candidate=["muon"])


# A training command that records its arguments and writes the metrics of a run of train.max_steps
# steps at 500 tokens/s (2 s of training), or fails as scripts/train.py does on a bad value.
FAKE_TRAINER = """
import json, pathlib, sys
args = dict(arg.split("=", 1) for arg in sys.argv[2:])
with open(sys.argv[1], "a") as log:
    log.write(" ".join(sys.argv[2:]) + "\\n")
if args.get("pos") == "broken":
    sys.exit("error: model.pos='broken' is invalid")
run = pathlib.Path(args["hydra.run.dir"])
run.mkdir(parents=True)
record = dict(step=int(args["train.max_steps"]), tokens=1000, tok_per_s=500.0)
(run / "metrics.jsonl").write_text(json.dumps(record) + "\\n")
"""


def test_labs_run_each_labs_job_compiled_then_eager_and_compiled_alternated_through_the_trainer(
        tmp_path, monkeypatch):
    """Each mode's row holds the median of its jobs' wall times and their range: the wall times are
    scripted here (the commands still run), so the medians are known."""
    log = tmp_path / "commands.txt"
    cfg = tiny_config(only=["labs"], trainer=[sys.executable, "-c", FAKE_TRAINER, str(log)], threads=1,
                      labs_steps=7, labs_repeats=3)
    order = job_order(3)
    assert [mode for mode, _ in order] == ["compiled, cache as found", *["eager", "compiled, cache warm"] * 3]
    walls = iter([50.0, 40.0, 30.0, 44.0, 20.0, 41.0, 35.0] * len(LAB_JOBS))  # one lab's, in that order
    run_job = nanoattn.bench.labs.run_job

    def scripted_wall(*args) -> float:
        run_job(*args)
        return next(walls)

    monkeypatch.setattr(nanoattn.bench.labs, "run_job", scripted_wall)
    rows = run_sections(["labs"], cfg)["labs"]
    commands = log.read_text().splitlines()
    assert len(rows) == 3 * len(LAB_JOBS) and len(commands) == len(order) * len(LAB_JOBS)
    for lab_rows, (lab, job), lab_commands in zip(
            (rows[i:i + 3] for i in range(0, len(rows), 3)), LAB_JOBS.items(),
            (commands[i:i + len(order)] for i in range(0, len(commands), len(order))), strict=True):
        assert all(r["lab"] == lab and r["steps"] == 7 and r["train_s"] == 2.0 for r in lab_rows)
        for command, (_, compiled) in zip(lab_commands, order, strict=True):
            assert command.startswith(" ".join(job) + " ")
            assert f"train.compile={compiled}" in command and "train.max_steps=7" in command
        summary = [(r["mode"], r["runs"], r["wall_s"], r["wall_s_low"], r["wall_s_high"]) for r in lab_rows]
        assert summary == [("compiled, cache as found", 1, 50.0, 50.0, 50.0), ("eager", 3, 41.0, 40.0, 44.0),
                           ("compiled, cache warm", 3, 30.0, 20.0, 35.0)]
        assert [r["vs_eager"] for r in lab_rows] == [41 / 50, 1.0, 41 / 30]
    monkeypatch.setattr(nanoattn.bench.labs, "run_job", run_job)
    monkeypatch.setitem(LAB_JOBS, "extrapolation", ("experiment=extrapolation", "pos=broken"))
    failure = (r"^bench.labs: experiment=extrapolation pos=broken .*train.compile=true failed \(exit 1\): "
               r"error: model.pos='broken' is invalid$")
    with pytest.raises(ValueError, match=failure):
        run_sections(["labs"], cfg)
    with pytest.raises(ValueError, match=r"^bench.trainer=\[\] is invalid: must be the training command"):
        run_sections(["labs"], tiny_config(only=["labs"]))
    with pytest.raises(ValueError, match=r"^bench.labs_steps=0 is invalid"):
        tiny_config(labs_steps=0)
    with pytest.raises(ValueError, match=r"^bench.labs_repeats=0 is invalid"):
        tiny_config(labs_repeats=0)


@pytest.mark.parametrize("token_shift", [False, True])
def test_the_bare_reference_and_the_twin_compute_gpts_loss_from_its_weights(token_shift):
    """A gate drawn away from its initial 0, so that the shift is in the function compared."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16,
                      tie_embeddings=False, token_shift=token_shift)
    ours = GPT(cfg)
    if token_shift:
        with torch.no_grad():
            ours.shift_gate.normal_()
    bare = BareGPT(cfg)
    bare.load_state_dict(ours.state_dict())
    x, y = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(bare(x, y), ours.loss(x, y))
        torch.testing.assert_close(TwinLoss(training_twin(ours, torch.device("cpu")))(x, y), ours.loss(x, y))
    with pytest.raises(ValueError, match=r"model.pos='alibi' is outside the bare reference"):
        BareGPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=4, pos="alibi"))


def test_the_bare_reference_refuses_every_variant_and_encoding_it_does_not_compute():
    """Its plain values are every config field's default but those it reads: a variant whose fields it
    never listed (sigmoid scores, FoX, selective attention, value embeddings, K/V shift) is refused
    too, in one line naming a field the variant sets. What it computes (token shift) builds."""
    base = ModelConfig(vocab_size=64, d_model=32, n_layer=4, n_head=4, n_kv_head=2, max_seq_len=16)
    options = {**ATTENTION_VARIANTS, **encoding_options()}
    computed = {name for name, fields in options.items()
                if all(field in IMPLEMENTED or value == PLAIN[field] for field, value in fields.items())}
    assert computed == {"plain", "token_shift", "rope"}
    for name, fields in options.items():
        if name in computed:
            BareGPT(dataclasses.replace(base, **fields))
            continue
        with pytest.raises(ValueError) as refusal:
            BareGPT(dataclasses.replace(base, **fields))
        message = str(refusal.value)
        assert "\n" not in message and message.endswith(")"), name
        field = message.removeprefix("model.").split("=", 1)[0]
        assert field in fields and " is outside the bare reference (it implements " in message, name


def test_the_sweep_table_has_steps_to_target_per_seed_and_a_mean_per_recipe(tmp_path):
    def run(recipe, seed, bpbs):
        folder = tmp_path / recipe / seed
        folder.mkdir(parents=True)
        records = [{"step": 100 * (i + 1), "tokens": 1000 * (i + 1), "tok_per_s": 100.0, "val_bpb": b}
                   for i, b in enumerate(bpbs)]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    run("fast", "seed0", [3.0, 2.0, 1.5])
    run("fast", "seed1", [3.0, 2.2, 1.6])
    run("slow", "seed0", [3.0, 2.8, 2.6])
    cfg = BenchConfig(only=["sweep"], sweep=str(tmp_path), speedrun_target=2.0)
    rows = run_sections(["sweep"], cfg)["sweep"]
    by = {(r["recipe"], r["seed"]): r for r in rows}
    assert by["fast", "seed0"]["steps_to_target"] == 200 and by["fast", "seed0"]["time_to_target_s"] == 20.0
    assert by["fast", "seed1"]["steps_to_target"] == pytest.approx(700 / 3)  # 2.2 at 200, 1.6 at 300
    assert by["slow", "seed0"]["steps_to_target"] is None
    assert by["fast", "mean of 2"]["steps_to_target"] == pytest.approx((200 + 700 / 3) / 2)
    assert by["fast", "mean of 2"]["val_bpb"] == pytest.approx(1.55)
    assert by["slow", "mean of 1"]["steps_to_target"] is None
    assert "skipped" in run_sections(["sweep"], BenchConfig(only=["sweep"]))["sweep"][0]["note"]
