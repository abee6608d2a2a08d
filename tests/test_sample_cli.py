"""``scripts/sample.py`` on a tiny random checkpoint: reproducible, and one-line errors.

The command itself runs in subprocesses (two at once, to keep the test short), and once more on a
corrupt checkpoint, for the one-line error of a real process; the function it calls
(``nanoattn.commands.sample``) and ``configs/sample.yaml`` are also checked in process, and so are the
command line's other mistakes (tests/test_one_line_errors.py).
"""

from __future__ import annotations

import importlib
import io
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from tokenizers import AddedToken, Tokenizer, decoders, models

from nanoattn import GPT, ModelConfig, runtime
from nanoattn.checkpoint import load_checkpoint, save_checkpoint
from nanoattn.commands.sample import SampleConfig, sample, unescape
from nanoattn.runtime import autocast_dtype
from nanoattn.text import sample_text
from nanoattn.validation import from_dict

ROOT = Path(__file__).resolve().parents[1]
# The module: the package's own name `generate` is the function.
generate_module = importlib.import_module("nanoattn.generate")
sys.path.insert(0, str(ROOT / "scripts"))
from _hydra_cli import register_schema  # noqa: E402  (scripts/ is not a package)

register_schema("sample_schema", SampleConfig)
CHARS = "abcdefghijklmnopqrstuvwxyzRMEO .,:\n"
MAX_SEQ_LEN = 16


def save_tiny(root: Path, pos: str) -> Path:
    """A random tiny GPT with a char tokenizer (EOT id 0), saved as a run directory."""
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True)])
    tokenizer.save(str(root / "tokenizer.json"))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(vocab), d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64,
                      max_seq_len=MAX_SEQ_LEN, pos=pos, init_std=0.1)
    save_checkpoint(root / pos / "checkpoints", "5", GPT(cfg), train_seq_len=MAX_SEQ_LEN, step=5,
                    tokenizer_file=root / "tokenizer.json")
    return root / pos


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runs")
    return {pos: save_tiny(root, pos) for pos in ("rope", "learned")}


def launch(*overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "scripts" / "sample.py"), *overrides], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=300)
    return process.returncode, out, err


def in_process(runs, pos: str = "rope", **options) -> tuple[list[str], str, str]:
    out, err = io.StringIO(), io.StringIO()
    cfg = SampleConfig(ckpt=str(runs[pos]), device="cpu", **{"max_new_tokens": 30, **options})
    texts = sample(cfg, out=out, err=err)
    return texts, out.getvalue(), err.getvalue()


def test_cli_same_seed_same_text_other_seed_differs(runs):
    options = dict(prompt="ROMEO:", max_new_tokens=40, num_samples=2, temperature=1.0)
    process = launch(f"ckpt={runs['rope']}", "seed=7", *(f"{k}={v}" for k, v in options.items()))
    _, printed, err = in_process(runs, seed=7, **options)  # meanwhile: the same seed in this process
    _, other_seed, _ = in_process(runs, seed=8, **options)
    rc7, out7, err7 = finish(process)
    assert rc7 == 0, err7
    assert out7 == printed and out7 != other_seed
    # dtype=auto is the rule every command shares (bf16 autocast only where the hardware is fast at it).
    assert f"({autocast_dtype('auto', torch.device('cpu'))[0] or torch.float32}, cpu)" in err
    assert out7.startswith("ROMEO:") and "-" * 40 in out7  # two samples, each after the prompt
    last = err7.strip().splitlines()[-1]
    assert "tok/s" in last and "KV cache" in last and "bytes" in last


def test_a_corrupt_checkpoint_is_one_line_in_a_real_process(runs, tmp_path):
    """The command line's other mistakes are refused in process (tests/test_one_line_errors.py)."""
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    checkpoint = runs["rope"] / "checkpoints" / "5"
    for name in ("config.json", "tokenizer.json"):
        (corrupt / name).write_bytes((checkpoint / name).read_bytes())
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    rc, out, err = finish(launch(f"ckpt={corrupt}"))
    assert rc != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "is corrupt" in lines[0], err


def test_streaming_prints_the_same_text(runs):
    for prompt in ("ROMEO:\\n", None):
        texts, printed, _ = in_process(runs, prompt=prompt, seed=3, temperature=1.0)
        streamed_texts, streamed, _ = in_process(runs, prompt=prompt, seed=3, temperature=1.0, stream=True)
        assert texts == streamed_texts and printed == streamed
        assert printed == ("ROMEO:\n" if prompt else "") + texts[0] + "\n"


def test_stop_strings_cut_the_output(runs):
    options = dict(prompt="ROMEO:", seed=5, temperature=1.0, max_new_tokens=40)
    free, _, _ = in_process(runs, **options)
    stop = free[0][6:8]
    texts, printed, _ = in_process(runs, stop=[stop], **options)
    assert texts[0] == free[0][:free[0].find(stop)] and stop not in texts[0]
    assert printed == "ROMEO:" + texts[0] + "\n"


def test_past_the_training_length(runs):
    """RoPE with a zero-shot scaling decodes past max_seq_len; learned positions need sliding_window."""
    for pos, options in (("rope", {"rope_scaling": {"type": "yarn", "factor": 4}}),
                         ("learned", {"sliding_window": True})):
        _, _, err = in_process(runs, pos, prompt="ROMEO:", max_new_tokens=3 * MAX_SEQ_LEN, **options)
        assert err.startswith("decoded ") and "KV cache" in err
    with pytest.raises(ValueError, match="learned position table.*sliding_window=True"):
        in_process(runs, "learned", prompt="ROMEO:", max_new_tokens=MAX_SEQ_LEN)


def test_streaming_llm_decodes_a_stream_in_a_fixed_cache(runs):
    """[n_sink, window] = [2, 6]: 48 new tokens through an 8-token cache, as generate(streaming=...)."""
    texts, _, err = in_process(runs, prompt="ROMEO:", max_new_tokens=3 * MAX_SEQ_LEN, streaming_llm=[2, 6],
                               dtype="float32", seed=7)
    tokenizer = Tokenizer.from_file(str(runs["rope"].parent / "tokenizer.json"))
    expected, _ = sample_text(load_checkpoint(runs["rope"]).model, tokenizer, tokenizer.encode("ROMEO:").ids,
                              3 * MAX_SEQ_LEN, streaming=(2, 6), stop_tokens=[0], temperature=0.8,
                              generator=torch.Generator().manual_seed(7))
    assert texts == expected and len(set(texts[0])) > 5
    assert "KV cache 2,048 bytes" in err  # 2 layers x K and V x 8 slots x 2 heads x 8 dims x 4 bytes


def test_config_composes_with_rope_scaling_overrides():
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            for overrides in (["+rope_scaling.type=yarn", "+rope_scaling.factor=4"],
                              ["rope_scaling={type:yarn,factor:4}"]):
                cfg = compose("sample", overrides=["ckpt=runs/x", 'stop=["\\n\\n",END]', *overrides])
                sample_cfg = from_dict(SampleConfig, OmegaConf.to_container(cfg), owner="sample")
                assert sample_cfg.rope_scaling == {"type": "yarn", "factor": 4}
                assert sample_cfg.stop == ["\n\n", "END"]
            defaults = OmegaConf.to_container(compose("sample", ["ckpt=x"]))
            assert from_dict(SampleConfig, defaults, owner="sample") == SampleConfig(ckpt="x")
    finally:
        GlobalHydra.instance().clear()


def test_compile_true_sends_the_one_token_steps_to_the_compiled_function(runs, monkeypatch):
    """The command's option reaches ``Decoding``: every one-token step after the first goes to
    ``compiled_step_logits()``, here the eager function counted (compiling is tested in test_generate)."""
    calls = []

    def counted(*args):
        calls.append(tuple(args[1].shape))
        return generate_module.step_logits(*args)

    monkeypatch.setattr(generate_module, "compiled_step_logits", lambda: counted)
    texts, _, _ = in_process(runs, prompt="ROMEO:", temperature=0, dtype="float32", compile=True)
    assert len(calls) == 30 - 2 and set(calls) == {(1, 1)}  # not the prompt's step, nor the first token's
    assert texts == in_process(runs, prompt="ROMEO:", temperature=0, dtype="float32")[0]


@pytest.mark.parametrize("values, match", [
    ({}, "sample.ckpt=None"),
    ({"ckpt": "x", "prompt": "a", "prompt_file": "p.txt"}, "not both"),
    ({"ckpt": "x", "num_samples": 0}, "sample.num_samples=0"),
    ({"ckpt": "x", "dtype": "fp16"}, "sample.dtype='fp16'"),
    ({"ckpt": "x", "device": "gpu"}, "sample.device='gpu'"),
    ({"ckpt": "x", "stream": "yes"}, "sample.stream='yes'"),
    ({"ckpt": "x", "compile": "yes"}, "sample.compile='yes' is invalid: allowed: true | false | auto"),
    ({"ckpt": "x", "stop": [""]}, "sample.stop"),
    ({"ckpt": "x", "temprature": 1}, "sample.temprature"),
])
def test_sample_config_errors(values, match):
    with pytest.raises(ValueError, match=match):
        from_dict(SampleConfig, values, owner="sample")


def test_unescape():
    assert unescape(r"ROMEO:\n\tx \\n") == "ROMEO:\n\tx \\n"


def test_padding_ids_past_the_tokenizer_are_never_sampled(tmp_path):
    vocab = {"<|endoftext|>": 0, **{c: i + 1 for i, c in enumerate(CHARS)}}
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=len(vocab) + 64, d_model=32, n_layer=1, n_head=2, max_seq_len=MAX_SEQ_LEN)
    model = GPT(cfg).eval()
    with torch.no_grad():
        model.lm_head.weight[len(vocab):] *= 50  # the padding rows would win almost every draw
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    _, decoding = sample_text(model, tokenizer, [0], 200, num_samples=4, temperature=1.0,
                              generator=torch.Generator().manual_seed(0))
    assert int(decoding.idx.max()) < len(vocab)
    assert int(decoding.last_logits.argmax(-1).min()) >= len(vocab)  # they were the likeliest, and masked


def test_a_huge_batch_or_length_is_refused_before_allocating(runs, monkeypatch):
    monkeypatch.setattr(runtime.device, "memory_bytes", lambda device: 2**30)  # a machine with 1 GiB
    with pytest.raises(ValueError, match=r"^the token buffer for 1000 sequence\(s\) x 200000001 tokens needs "
                                         r"1,490\.1 GiB, more than the 1\.0 GiB of cpu; ask for fewer"):
        in_process(runs, max_new_tokens=200_000_000, num_samples=1000)
    # K and V: 2 layers x 2 kv heads x head_dim 8 x 4 bytes x 2 = 256 bytes a token:
    with pytest.raises(ValueError, match=r"^a KV cache for 64 sequence\(s\) x 1000001 tokens needs 15\.3 GiB"
                                         r", more than"):
        in_process(runs, max_new_tokens=1_000_000, num_samples=64, dtype="float32")


def test_a_missing_prompt_file_is_one_line(runs, tmp_path):
    with pytest.raises(ValueError, match=r"^sample\.prompt_file='.*nope\.txt' cannot be read: No such file"):
        in_process(runs, prompt_file=str(tmp_path / "nope.txt"))
