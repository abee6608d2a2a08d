"""The benchmark's code paths on tiny shapes: what each section compares, never how fast it is.

Speed is only ever measured by ``scripts/bench.py``; these tests check that the comparisons are
of like with like (the same loss from both implementations, identical greedy tokens, the same
training step as the run's) and that every section and the command line run.
"""

from __future__ import annotations

import json
import math
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from nanoattn.bench import EVAL_POSITIONS, BenchOptions, format_table, read_run_rate, run_sections
from nanoattn.config import ModelConfig, RunConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = dict(vocab_size=96, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=16)


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny ops on a shared 2-core machine: a second torch thread spin-waits (here 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_options(**overrides) -> BenchOptions:
    values = dict(quick=True, reps=1, model=ModelConfig(**TINY, tie_embeddings=False), batch_size=2,
                  seq_len=16, decode_model=ModelConfig(**TINY), e2e_seconds=0.0)
    return BenchOptions(**{**values, **overrides})


def write_run(run: Path, rates: list[float]) -> None:
    """A run directory as scripts/train.py writes it: config.yaml and one metrics record per window."""
    cfg = RunConfig(model=ModelConfig(**TINY), train={"batch_size": 2, "seq_len": 16, "grad_accum": 2,
                                                      "dtype": "float32"})
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    records = [{"step": 10 * (i + 1), "train_loss": 4.0, "lr": 1e-3, "tokens": 640 * (i + 1), "tok_per_s": r}
               for i, r in enumerate(rates)]
    records[2].update(val_loss=4.1, val_bpb=2.0)  # an evaluation window's record is a train record too
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_every_section_runs_and_compares_like_with_like(tmp_path):
    write_run(tmp_path / "run", [10.0, 500.0, 300.0, 400.0])
    rows = run_sections(["train", "mfu", "decode", "eval", "e2e"], tiny_options(run=str(tmp_path / "run")))

    train = rows["train"]
    assert [(r["impl"], r["dtype"]) for r in train] == [(impl, dtype) for dtype in ("float32", "bfloat16")
                                                         for impl in ("nanoattn", "transformers")]
    # The exported twin has our weights, so both compute the same loss before any step.
    assert train[0]["initial_loss"] == pytest.approx(train[1]["initial_loss"], rel=1e-5)
    assert all(r["vs_transformers"] == 1.0 for r in train if r["impl"] == "transformers")
    assert "vs_transformers" in format_table(train).splitlines()[0]

    mfu = rows["mfu"]
    assert [(r["impl"], r["dtype"]) for r in mfu[:2]] == [("matmul 1024^3", "float32"),
                                                          ("matmul 1024^3", "bfloat16")]
    assert all(math.isfinite(r["mfu"]) and r["mfu"] > 0 for r in mfu[2:])

    decode = rows["decode"]
    greedy = [(r["impl"], r["batch"], r["same_tokens"]) for r in decode if r["impl"].endswith("greedy")]
    assert greedy == [("nanoattn greedy", 1, True), ("transformers greedy", 1, True),
                      ("nanoattn greedy", 8, True), ("transformers greedy", 8, True)]
    kv_bytes = {r["layout"]: r["kv_cache_bytes"] for r in decode if r["model"].startswith("same shape")}
    assert kv_bytes["MHA"] == 2 * kv_bytes["GQA-2"] == 4 * kv_bytes["MQA"]  # shrinks by n_head / n_kv_head

    evaluation = rows["eval"]
    assert sorted({r["pos"] for r in evaluation}) == sorted(EVAL_POSITIONS)
    assert [r["multiple"] for r in evaluation if r["pos"] == "learned"] == [1]  # nothing past its table
    assert [r["length"] for r in evaluation if r["pos"] == "rope"] == [64, 256, 1024]  # quick: 1x = 64

    [e2e] = rows["e2e"]
    assert e2e["shape"].endswith("B4 T16")  # batch_size x grad_accum sequences per optimizer step
    assert e2e["script_tok_per_s"] == 400.0
    assert e2e["script_vs_step"] == pytest.approx(400.0 / e2e["step_tok_per_s"])


def test_run_rate_leaves_out_the_first_window(tmp_path):
    write_run(tmp_path / "run", [10.0, 500.0, 300.0, 400.0])
    cfg, rate, windows = read_run_rate(tmp_path / "run")
    assert (cfg.train.batch_size, cfg.train.grad_accum, cfg.seq_len) == (2, 2, 16)
    assert (rate, windows) == (400.0, 3)


def test_decode_without_a_transformers_counterpart_says_why():
    alibi = ModelConfig(**{**TINY, "n_layer": 1, "pos": "alibi"})
    [*_, last] = run_sections(["decode"], tiny_options(decode_model=alibi))["decode"]
    assert "comparison skipped: model.pos='alibi' has no transformers counterpart" in last["impl"]


def test_e2e_without_a_run_is_skipped_with_a_note():
    assert "skipped" in run_sections(["e2e"], tiny_options())["e2e"][0]["note"]


def test_bad_options_are_one_line_errors(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "bench.py"), "--only", "e2e", "--run",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and done.stderr == (f"error: bench.run={str(tmp_path)!r} is invalid: no "
                                                    "config.yaml (pass a run directory)\n")
    script = runpy.run_path(str(ROOT / "scripts" / "bench.py"))  # the same main(), in this process
    for args, message in ((["--only", "eval", "--dtype", "float16"], "bench.dtype='float16' is invalid"),
                          (["--model", "nope"], "unknown model preset 'nope'")):
        with pytest.raises(SystemExit, match=f"^error: {message}"):
            script["main"](args)
    with pytest.raises(ValueError, match="bench.reps=0 is invalid"):
        BenchOptions(reps=0)
    with pytest.raises(ValueError, match="bench section 'speed' is unknown"):
        run_sections(["speed"], BenchOptions())
