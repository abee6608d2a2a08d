"""Length evaluation: perplexity against per-target forward passes, per-position loss, learned past
its table, bounded attention masks, and the checkpoint-level report, command, script and config."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from test_one_line_errors import expect_one_line, run_script

from nanoattn import GPT, ModelConfig, load_checkpoint
from nanoattn.checkpoint import save_checkpoint
from nanoattn.commands.eval_length import LengthEvalConfig, eval_length, run_length_eval
from nanoattn.data import TokenData
from nanoattn.eval import evaluate_lengths, lengths_from_multiples, score_length
from nanoattn.eval import runs as eval_runs
from nanoattn.eval.length import PeakMemory, window_starts
from nanoattn.eval.runs import default_output
from nanoattn.model import routes
from nanoattn.positional import REGISTRY, encodings_with
from nanoattn.validation import from_dict

REPO = Path(__file__).resolve().parents[2]
VOCAB = 32


def tiny_model(pos: str, max_seq_len: int = 16, vocab_size: int = VOCAB, seed: int = 0, **variant) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=vocab_size, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64,
                  max_seq_len=max_seq_len, pos=pos)
    cfg = ModelConfig(**{**fields, **variant})
    return GPT(cfg).eval()


def reference_loss(model: GPT, tokens: torch.Tensor, context_start) -> float:
    """Mean of -log p(tokens[j] | tokens[context_start(j):j]) over targets j = 1..n, one forward each."""
    n = tokens.numel() - 1
    total = 0.0
    with torch.no_grad():
        for j in range(1, n + 1):
            logits = model(tokens[context_start(j):j][None])[0, -1]  # [V]: the prediction of token j
            total -= F.log_softmax(logits.double(), dim=-1)[tokens[j]].item()
    return total / n


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_chunks_match_per_target_forward_passes(pos):
    model, length = tiny_model(pos), 16
    tokens = torch.randint(0, VOCAB, (51,), generator=torch.Generator().manual_seed(1))  # 50 targets
    n = 50
    # Chunks at 0, 16, 32 score targets 1..48; one last window at n - L = 34 scores targets 49, 50.
    expected = reference_loss(model, tokens, lambda j: min((j - 1) // length * length, n - length))
    loss, scored, _ = score_length(model, tokens, length, batch_size=2)
    assert scored == n
    assert loss == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_sliding_window_matches_per_target_forward_passes(pos):
    model, length, stride = tiny_model(pos), 16, 4
    tokens = torch.randint(0, VOCAB, (51,), generator=torch.Generator().manual_seed(2))
    n = 50
    # Target j is scored by the first window reaching it: start ceil((j - L) / s) * s, at most n - L.
    expected = reference_loss(
        model, tokens, lambda j: min(max(0, math.ceil((j - length) / stride) * stride), n - length))
    loss, scored, _ = score_length(model, tokens, length, stride=stride, batch_size=3)
    assert scored == n
    assert loss == pytest.approx(expected, abs=1e-5)


def test_window_starts_cover_the_stream_to_its_end():
    assert window_starts(48, 16, 16) == [0, 16, 32]
    assert window_starts(50, 16, 16) == [0, 16, 32, 34]
    assert window_starts(50, 16, 8) == [0, 8, 16, 24, 32, 34]
    assert window_starts(16, 16, 4) == [0]


def test_per_position_loss_has_the_length_and_averages_to_the_loss():
    model, length = tiny_model("rope"), 16
    tokens = torch.randint(0, VOCAB, (16 * 5 + 1,), generator=torch.Generator().manual_seed(3))
    loss, _, per_position = score_length(model, tokens, length)
    assert per_position.shape == (length,)
    assert per_position.mean().item() == pytest.approx(loss, rel=1e-12)
    # Position 0 of each chunk predicts its second token from its first alone.
    with torch.no_grad():
        firsts = [F.cross_entropy(model(tokens[s:s + 1][None])[0].double(), tokens[s + 1:s + 2]).item()
                  for s in range(0, 80, 16)]
    assert per_position[0].item() == pytest.approx(sum(firsts) / len(firsts), abs=1e-5)


def test_learned_past_its_table_is_null_not_a_crash():
    model = tiny_model("learned", max_seq_len=16)
    tokens = torch.randint(0, VOCAB, (65,), generator=torch.Generator().manual_seed(4))
    sweep = evaluate_lengths(model, tokens, [8, 16, 32], bytes_per_token=2.0)
    by_length = {r.length: r.to_dict() for r in sweep.results}
    assert by_length[32]["ppl"] is None and by_length[32]["loss"] is None
    assert "learned position table" in by_length[32]["error"]
    for length in (8, 16):
        result = by_length[length]
        assert "error" not in result and result["tokens"] == 64
        assert result["ppl"] == pytest.approx(math.exp(result["loss"]))
        assert result["bpb"] == pytest.approx(result["loss"] / math.log(2) / 2.0)
    assert sweep.per_position_length == 16 and len(sweep.per_position_loss) == 16
    json.dumps([r.to_dict() for r in sweep.results])


@pytest.mark.parametrize("pos", [name for name in REGISTRY if name != "learned"])  # learned: undefined there
def test_attention_never_builds_a_heads_by_t_by_t_mask(monkeypatch, pos):
    """At 2048 tokens a [heads, T, T] mask would have 16.8M elements: biases stay in query chunks,
    and encodings without a bias build no mask at all (SDPA's causal kernel), unless their keys are
    wider than the values (PoPE's), which SDPA's fused kernels do not take: those go in chunks too."""
    length, built = 2048, []
    plan = routes.query_chunks

    def spy(batch, heads, queries, keys, window):  # every chunk a chunked route builds
        chunks = plan(batch, heads, queries, keys, window)
        built.extend(batch * heads * (stop - start) * (last - first) for start, stop, first, last in chunks)
        return chunks

    monkeypatch.setattr(routes, "query_chunks", spy)
    tokens = torch.randint(0, VOCAB, (length + 1,), generator=torch.Generator().manual_seed(5))
    model = tiny_model(pos)
    score_length(model, tokens, length)
    if not REGISTRY[pos].adds_bias and REGISTRY[pos].key_width(model.cfg.head_dim) == model.cfg.head_dim:
        assert built == []
    else:
        materialised = model.cfg.n_head * length * length
        assert built and max(built) <= routes.MASK_CHUNK_ELEMENTS < materialised


def test_peak_memory_sees_torch_cpu_allocations():
    with PeakMemory(torch.device("cpu")) as memory:
        block = torch.ones(16 * 2**20)  # 64 MiB
        del block
    assert 60 * 2**20 < memory.bytes < 200 * 2**20


def test_lengths_from_multiples():
    assert lengths_from_multiples(128) == [128, 160, 192, 256, 512, 1024, 2048]
    assert lengths_from_multiples(100, [2, 1, 1.0]) == [100, 200]
    with pytest.raises(ValueError, match="multiples"):
        lengths_from_multiples(128, [1, -2])


@pytest.mark.parametrize("n_sink", [0, 2])
def test_streaming_mode_matches_per_target_forward_passes_over_sinks_and_window(n_sink):
    """One layer, so cached keys and values depend on their token alone: target j is predicted from
    the first n_sink tokens and the newest 8 - n_sink, at positions 0..7 (StreamingLLM)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=VOCAB, d_model=32, n_layer=1, n_head=4, n_kv_head=2,
                            max_seq_len=16)).eval()
    tokens = torch.randint(0, VOCAB, (41,), generator=torch.Generator().manual_seed(1))
    window = 8 - n_sink
    total = 0.0
    with torch.no_grad():
        for j in range(1, 41):
            context = tokens[:j] if j <= 8 else torch.cat([tokens[:n_sink], tokens[j - window:j]])
            total -= F.log_softmax(model(context[None])[0, -1].double(), dim=-1)[tokens[j]].item()
    [result] = evaluate_lengths(model, tokens, [8], mode="streaming", n_sink=n_sink).results
    assert result.tokens == 40 and result.loss == pytest.approx(total / 40, abs=1e-5)
    with pytest.raises(ValueError, match="each is a cache of n_sink=8 sinks plus a window"):
        evaluate_lengths(model, tokens, [8], mode="streaming", n_sink=8)


def test_bad_arguments_are_one_line_errors():
    model = tiny_model("rope")
    tokens = torch.zeros(65, dtype=torch.long)
    with pytest.raises(ValueError, match="mode='window'"):
        evaluate_lengths(model, tokens, [16], mode="window")
    with pytest.raises(ValueError, match="stride=4 is invalid with mode='chunks'"):
        evaluate_lengths(model, tokens, [16], stride=4)
    with pytest.raises(ValueError, match="stride=32 is invalid: must be at most the shortest length 16"):
        evaluate_lengths(model, tokens, [16, 64], mode="sliding", stride=32)
    with pytest.raises(ValueError, match="lengths"):
        evaluate_lengths(model, tokens, [16, 0])
    with pytest.raises(ValueError, match="dtype='half'"):
        evaluate_lengths(model, tokens, [16], dtype="half")
    # A length longer than the stream is an error entry, not an exception.
    assert "fewer than one window of 128" in evaluate_lengths(model, tokens, [128]).results[0].error


def test_bfloat16_autocast_scores_close_to_float32():
    """dtype is the runtime vocabulary: bfloat16 runs under autocast, within bf16 rounding of float32."""
    model = tiny_model("rope")
    tokens = torch.randint(0, VOCAB, (65,), generator=torch.Generator().manual_seed(7))
    full, _, _ = score_length(model, tokens, 16)
    half, _, _ = score_length(model, tokens, 16, dtype="bfloat16")
    assert half != full and half == pytest.approx(full, rel=2e-2)
    assert evaluate_lengths(model, tokens, [16], dtype="auto").results[0].error is None


@pytest.mark.parametrize(("values", "message"), [
    ({}, "eval_length.ckpt=None is invalid: required"),
    ({"ckpt": "r", "mode": "window"}, "eval_length.mode='window' is invalid: allowed: chunks | sliding"),
    ({"ckpt": "r", "stride": 0}, "eval_length.stride=0 is invalid: must be a positive integer"),
    ({"ckpt": "r", "max_tokens": -1}, "eval_length.max_tokens=-1 is invalid"),
    ({"ckpt": "r", "lengths": [16, 0]}, "eval_length.lengths=0 is invalid"),
    ({"ckpt": "r", "multiples": [1, -2]}, "eval_length.multiples=[1, -2] is invalid: -2 is not a positive"),
    ({"ckpt": "r", "dtype": "half"}, "eval_length.dtype='half' is invalid: allowed: auto | float32"),
    ({"ckpt": "r", "device": "gpu"}, "eval_length.device='gpu' is invalid: allowed: auto | cpu"),
    ({"ckpt": "r", "rope_scaling": "yarn"}, "eval_length.rope_scaling='yarn' is invalid: must be a mapping"),
    ({"ckpt": "r", "plot": "yes"}, "eval_length.plot='yes' is invalid: must be true or false"),
    ({"ckpt": "r", "strid": 4}, "unknown key(s) eval_length.strid"),
])
def test_config_mistakes_are_one_line_errors(values, message):
    with pytest.raises(ValueError, match=re.escape(message)) as caught:
        from_dict(LengthEvalConfig, values, owner="eval_length")
    assert "\n" not in str(caught.value)


# ----------------------------------------------------------------------------- from a checkpoint


def save_run(run_dir: Path, pos: str, data_dir: Path, **variant) -> Path:
    data = TokenData(data_dir)
    model = tiny_model(pos, max_seq_len=32, vocab_size=data.vocab_size, **variant)
    save_checkpoint(run_dir / "checkpoints", "100", model, train_seq_len=32, step=100,
                    tokenizer_file=data_dir / "tokenizer.json")
    (run_dir / "config.yaml").write_text(f"data:\n  root: {data_dir.parent}\n  name: {data_dir.name}\n")
    speeds = (1000.0, 3000.0, 2000.0)  # the lab reports their median
    records = [{"step": 10 * (i + 1), "tok_per_s": speed} for i, speed in enumerate(speeds)]
    records[1]["max_attn_logit"], records[2]["max_attn_logit"] = 7.25, 6.5  # the attention lab: the largest
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    return run_dir


def test_report_from_a_run_directory(prepared, tmp_path, capsys):
    run = save_run(tmp_path / "rope_run", "rope", prepared)
    # data_dir: the one the run's config.yaml names.
    report = eval_length(LengthEvalConfig(ckpt=str(run), multiples=[1, 2, 4], max_tokens=512))
    file = run / "length_eval.json"
    assert json.loads(file.read_text()) == report and file.with_suffix(".png").stat().st_size > 10_000
    assert report["train_seq_len"] == 32 and report["mode"] == "chunks" and report["rope_scaling"] is None
    assert report["data_dir"] == str(prepared)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("Perplexity on held-out text by evaluation length")  # the table's quantity
    assert printed[1] == "| run | 32 (1×) | 64 (2×) | 128 (4×) |" and printed[3].startswith("| rope_run |")
    assert printed[-1] == f"wrote {file} and {file.with_suffix('.png')}"
    assert [r["length"] for r in report["results"]] == [32, 64, 128]
    for result in report["results"]:
        assert set(result) == {"length", "stride", "loss", "ppl", "bpb", "tokens", "peak_memory_bytes",
                               "tok_per_s"}
        assert result["tokens"] == 512 and result["peak_memory_bytes"] >= 0 and result["tok_per_s"] > 0
    assert report["per_position_length"] == 128 and len(report["per_position_loss"]) == 128
    # The same stream scored directly gives the same numbers.
    stream = torch.from_numpy(TokenData(prepared).tokens("val")[:513].astype("int64"))
    direct, _, _ = score_length(load_checkpoint(run).model, stream, 64)
    assert report["results"][1]["loss"] == pytest.approx(direct)


def test_chunked_and_sliding_reports_of_one_run_stand_side_by_side(prepared, tmp_path):
    """A sliding evaluation replaced the chunked report of the same run before; each protocol (and each
    stride) now has a file of its own, named by what differs from the default."""
    run = save_run(tmp_path / "rope_run", "rope", prepared)
    chunks = run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[64], max_tokens=256, plot=False))
    sliding = run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[64], max_tokens=256, plot=False,
                                               mode="sliding", stride=16))
    assert json.loads((run / "length_eval.json").read_text()) == chunks
    assert json.loads((run / "length_eval_sliding_stride16.json").read_text()) == sliding
    assert chunks["mode"] == "chunks" and sliding["mode"] == "sliding"
    assert sliding["results"][0]["loss"] != chunks["results"][0]["loss"]


def test_rope_scaling_override_names_its_file_and_changes_the_model(prepared, tmp_path):
    run = save_run(tmp_path / "rope_run", "rope", prepared)
    plain = run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[128], max_tokens=256, plot=False))
    scaled = run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[128], max_tokens=256, plot=False,
                                              rope_scaling={"type": "yarn", "factor": 4}))
    assert (run / "length_eval_yarn4.json").exists()
    assert scaled["rope_scaling"]["type"] == "yarn" and scaled["rope_scaling"]["original_max_seq_len"] == 32
    assert scaled["results"][0]["loss"] != plain["results"][0]["loss"]


@pytest.mark.parametrize("pos,variant", [("xpos", {}), (["rope", "rope", "rope", "nope"], {"n_layer": 4})],
                         ids=["xpos", "irope"])
def test_every_rotary_model_is_scaled_zero_shot(prepared, tmp_path, pos, variant):
    run = save_run(tmp_path / "run", pos, prepared, init_std=0.2, **variant)
    plain = run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[128], max_tokens=256, plot=False))
    scaled = run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[128], max_tokens=256, plot=False,
                                              rope_scaling={"type": "yarn", "factor": 4}))
    assert (run / "length_eval_yarn4.json").exists()
    assert scaled["rope_scaling"]["type"] == "yarn" and scaled["rope_scaling"]["original_max_seq_len"] == 32
    assert math.isfinite(scaled["results"][0]["loss"])
    assert scaled["results"][0]["loss"] != plain["results"][0]["loss"]


def test_the_script_scales_an_xpos_run_zero_shot(prepared, tmp_path, monkeypatch):
    run = save_run(tmp_path / "xpos_run", "xpos", prepared)
    assert run_script(monkeypatch, "eval_length", f"ckpt={run}", "rope_scaling={type:yarn,factor:4}",
                      "lengths=[64]", "max_tokens=128", "plot=false") is None
    report = json.loads((run / "length_eval_yarn4.json").read_text())
    assert report["rope_scaling"]["factor"] == 4 and math.isfinite(report["results"][0]["loss"])


def test_default_output_names(prepared, tmp_path):
    run = save_run(tmp_path / "run", "rope", prepared)
    assert default_output(run, None, "length_eval") == run / "length_eval.json"
    assert default_output(run / "checkpoints" / "100", {"type": "linear", "factor": 2.5}, "length_eval") == \
        run / "length_eval_linear2.5.json"
    model = tiny_model("rope", max_seq_len=32, vocab_size=TokenData(prepared).vocab_size)
    save_checkpoint(run / "checkpoints", "200", model, train_seq_len=32, step=200)
    step100 = run / "length_eval_step100.json"
    assert default_output(run / "checkpoints" / "100", None, "length_eval") == step100
    assert LengthEvalConfig(ckpt=str(run / "checkpoints" / "100")).output() == \
        run / "length_eval_step100.json"
    assert LengthEvalConfig(ckpt=str(run), out="x/y.json").output() == Path("x/y.json")


def test_non_rope_refuses_a_scaling_and_a_foreign_tokenizer_is_refused(prepared, tmp_path):
    run = save_run(tmp_path / "alibi_run", "alibi", prepared)
    with pytest.raises(ValueError, match="needs a RoPE model") as info:
        run_length_eval(LengthEvalConfig(ckpt=str(run), rope_scaling={"type": "linear", "factor": 2}))
    assert "pos='alibi'" in str(info.value) and " | ".join(encodings_with("rotary")) in str(info.value)
    other = tmp_path / "other"
    other.mkdir()
    for file in prepared.iterdir():
        if file.name != "tokenizer.json":
            (other / file.name).write_bytes(file.read_bytes())
    tok = json.loads((prepared / "tokenizer.json").read_text())
    tok["added_tokens"][0]["content"] = "<|other|>"
    (other / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ValueError, match="another tokenizer"):
        run_length_eval(LengthEvalConfig(ckpt=str(run), data_dir=str(other)))


def test_the_script_writes_the_report_and_prints_one_line_errors(prepared, tmp_path, monkeypatch):
    run = save_run(tmp_path / "learned_run", "learned", prepared)
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "eval_length.py"), f"ckpt={run}",
                           "lengths=[16,32,64]", "max_tokens=256"], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    results = json.loads((run / "length_eval.json").read_text())["results"]
    assert [r["ppl"] is None for r in results] == [False, False, True]
    assert "| learned_run |" in done.stdout and "n/a" in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["learned_run"]  # Hydra littered nothing
    # How a refusal reaches a real process's stderr is tests/train/test_cli.py's; here, that it is one line.
    expect_one_line(run_script(monkeypatch, "eval_length", f"ckpt={run}", "+rope_scaling.type=yarn",
                               "+rope_scaling.factor=4"), ".*needs a RoPE model")


def test_the_config_composes_with_scaling_overrides(eval_schemas):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("eval_length", ["ckpt=runs/x"]))
            dotted = compose("eval_length", ["ckpt=runs/x", "+rope_scaling.type=yarn",
                                             "+rope_scaling.factor=4"])
            inline = compose("eval_length", ["ckpt=runs/x", "rope_scaling={type:yarn,factor:4}"])
    finally:
        GlobalHydra.instance().clear()
    assert cfg["multiples"] == [1, 1.25, 1.5, 2, 4, 8, 16] and cfg["mode"] == "chunks"
    assert OmegaConf.to_container(dotted.rope_scaling) == OmegaConf.to_container(inline.rope_scaling) == \
        {"type": "yarn", "factor": 4}
    # Every key is a field of the dataclass, with its declared default: nothing is stated twice.
    assert from_dict(LengthEvalConfig, cfg, owner="eval_length") == LengthEvalConfig(ckpt="runs/x")


def test_out_never_overwrites_a_file_that_is_not_a_report(prepared, tmp_path, monkeypatch):
    run = save_run(tmp_path / "run", "rope", prepared)
    config = (run / "config.yaml").read_text()
    with monkeypatch.context() as before_any_work:  # checked before the checkpoint is loaded
        before_any_work.setattr(eval_runs, "load_for_eval", lambda *a, **k: pytest.fail("loaded first"))
        for out, message in ((run / "config.yaml", "is a .json file"),
                             (run / "notes.json", "exists and is not an evaluation report")):
            if out.suffix == ".json":
                out.write_text('{"mine": true}\n')
            with pytest.raises(ValueError, match=message):
                run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[32], max_tokens=64, out=str(out)))
    assert (run / "config.yaml").read_text() == config
    assert (run / "notes.json").read_text() == '{"mine": true}\n'
    (run / "figure.png").write_bytes(b"someone's figure")
    with pytest.raises(ValueError, match=r"figure\.png exists without an evaluation report beside it"):
        run_length_eval(LengthEvalConfig(ckpt=str(run), lengths=[32], max_tokens=64,
                                         out=str(run / "figure.json")))
    again = LengthEvalConfig(ckpt=str(run), lengths=[32], max_tokens=64, plot=False)
    run_length_eval(again)
    run_length_eval(again)  # an earlier report is ours to replace


def test_the_command_fails_when_every_length_failed(prepared, tmp_path):
    run = save_run(tmp_path / "run", "learned", prepared)  # a 32-row table: undefined past 32
    with pytest.raises(ValueError, match=r"^every length failed; the first: "):
        eval_length(LengthEvalConfig(ckpt=str(run), lengths=[64, 128], max_tokens=256, plot=False))
    report = json.loads((run / "length_eval.json").read_text())
    assert [r["ppl"] for r in report["results"]] == [None, None]  # written, saying why
