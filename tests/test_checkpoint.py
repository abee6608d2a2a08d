"""Checkpoints: atomic under a failure mid-save, pruned only after completion, never executing code."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

import nanoattn.checkpoint as ckpt_mod
from nanoattn import GPT, ModelConfig, load_checkpoint
from nanoattn.checkpoint import (
    CheckpointError,
    init_model_config,
    list_checkpoints,
    load_trainer_state,
    resolve_checkpoint,
    save_checkpoint,
)
from nanoattn.positional import REGISTRY, encodings_with
from nanoattn.positional.rope_scaling import normalize_rope_scaling

CFG = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=2, d_ff=64, max_seq_len=16)


def _model(seed: int) -> GPT:
    torch.manual_seed(seed)
    return GPT(CFG)


def _save(root, step, model, **kw):
    return save_checkpoint(root, f"{step:06d}", model, train_seq_len=16, step=step,
                           trainer_state={"step": step}, **kw)


def _same_weights(a: GPT, b: GPT) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_save_failing_midway_leaves_the_previous_checkpoint_and_latest(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    first = _model(0)
    _save(root, 1, first)

    def explode(*args, **kwargs):  # weights and config are written; the trainer state fails
        raise OSError("disk full")

    monkeypatch.setattr(ckpt_mod.torch, "save", explode)
    with pytest.raises(OSError, match="disk full"):
        _save(root, 2, _model(1))
    assert (root / "latest").read_text().strip() == "000001"
    assert [p.name for p in list_checkpoints(root)] == ["000001"]
    assert resolve_checkpoint(tmp_path) == root / "000001"
    assert _same_weights(load_checkpoint(tmp_path).model, first)
    assert sorted(p.name for p in root.iterdir()) == ["000001", "latest"]  # the partial copy is removed


def test_a_leftover_temp_dir_of_a_killed_save_is_ignored(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 1, _model(0))
    partial = root / ".000002.tmp4242"  # what a SIGKILL during save_checkpoint leaves
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"\x00" * 10)
    assert resolve_checkpoint(tmp_path).name == "000001"
    assert [p.name for p in list_checkpoints(root)] == ["000001"]
    _save(root, 2, _model(1))
    assert resolve_checkpoint(tmp_path).name == "000002"


def test_keep_last_prunes_only_after_the_new_checkpoint_is_complete(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        _save(root, step, _model(step), keep_last=2)
    assert [p.name for p in list_checkpoints(root)] == ["000002", "000003"]
    monkeypatch.setattr(ckpt_mod.torch, "save", lambda *a, **k: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError):
        _save(root, 4, _model(4), keep_last=2)
    assert [p.name for p in list_checkpoints(root)] == ["000002", "000003"]


def test_resaving_a_step_replaces_it(tmp_path):
    root = tmp_path / "checkpoints"
    _save(root, 1, _model(0))
    second = _model(1)
    _save(root, 1, second)
    assert _same_weights(load_checkpoint(root / "000001").model, second)
    assert sorted(p.name for p in root.iterdir()) == ["000001", "latest"]


class _Payload:
    """Unpickling this would create a file: the attack weights_only=True must refuse."""

    def __init__(self, marker: pathlib.Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def test_a_pickle_payload_in_trainer_state_is_refused_without_running(tmp_path):
    root = tmp_path / "checkpoints"
    path = _save(root, 1, _model(0))
    marker = tmp_path / "pwned"
    torch.save({"step": 1, "evil": _Payload(marker)}, path / "trainer_state.pt")
    with pytest.raises(CheckpointError) as err:
        load_trainer_state(path)
    assert not marker.exists()
    assert "\n" not in str(err.value) and "trainer_state.pt" in str(err.value)


def test_corrupt_and_missing_checkpoints_are_one_line_errors(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist"):
        resolve_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointError, match="neither a checkpoint"):
        resolve_checkpoint(tmp_path)
    path = _save(tmp_path / "checkpoints", 1, _model(0))
    (path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match="corrupt") as err:
        load_checkpoint(path)
    assert "\n" not in str(err.value)
    (path / "trainer_state.pt").write_bytes(b"not a zip")
    with pytest.raises(CheckpointError, match="corrupt"):
        load_trainer_state(path)
    (path / "latest").unlink(missing_ok=True)
    (tmp_path / "checkpoints" / "latest").write_text("000009\n")
    with pytest.raises(CheckpointError, match="does not name a checkpoint directory inside"):
        resolve_checkpoint(tmp_path)


def test_init_model_config_keeps_the_shape_and_takes_the_context_fields(tmp_path):
    path = _save(tmp_path / "checkpoints", 1, _model(0))
    run_model = {**ModelConfig().to_dict(), "d_model": 512, "max_seq_len": 64, "dropout": 0.1,
                 "rope_scaling": {"type": "yarn", "factor": 4.0}}
    cfg = init_model_config(path, run_model)
    assert (cfg.d_model, cfg.n_layer, cfg.vocab_size) == (CFG.d_model, CFG.n_layer, CFG.vocab_size)
    assert (cfg.max_seq_len, cfg.dropout) == (64, 0.1)
    assert cfg.rope_scaling["original_max_seq_len"] == 16  # the checkpoint's training length
    explicit = init_model_config(path, {"rope_scaling": {"type": "yarn", "factor": 4.0,
                                                         "original_max_seq_len": 8}})
    assert explicit.rope_scaling["original_max_seq_len"] == 8


def test_init_model_config_refuses_a_new_length_for_learned_positions(tmp_path):
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**CFG.to_dict(), "pos": "learned"}))
    path = save_checkpoint(tmp_path / "c", "000001", model, train_seq_len=16, step=1)
    with pytest.raises(ValueError, match=r"learned position table has 16 rows \(pos='learned'\)"):
        init_model_config(path, {"max_seq_len": 32})
    assert init_model_config(path, {"max_seq_len": 16, "dropout": 0.1}).dropout == 0.1


# Rotary models beyond pos=rope: xPos (rotation plus a decay) and Llama 4's iRoPE layout.
IROPE = ["rope", "rope", "rope", "nope"]
ROTARY = pytest.mark.parametrize("pos", ["xpos", IROPE], ids=["xpos", "irope"])


def _save_pos(tmp_path, pos) -> pathlib.Path:
    torch.manual_seed(0)
    model = GPT(ModelConfig(**{**CFG.to_dict(), "n_layer": 4, "pos": pos, "init_std": 0.2}))
    return save_checkpoint(tmp_path / "c", "000001", model, train_seq_len=16, step=1)


@ROTARY
def test_every_rotary_model_takes_a_zero_shot_scaling_in_its_rotary_layers(tmp_path, pos):
    path = _save_pos(tmp_path, pos)
    scaled = load_checkpoint(path, rope_scaling={"type": "yarn", "factor": 4})
    expected = normalize_rope_scaling({"type": "yarn", "factor": 4, "original_max_seq_len": 16}, 16)
    assert scaled.config.pos == pos and scaled.config.rope_scaling == expected
    for layer, name in enumerate(scaled.config.layer_pos):
        encoding = scaled.model.pos.for_layer(layer)
        assert encoding.rotary == REGISTRY[name].rotary
        assert not encoding.rotary or encoding.scaling == expected
    tokens = torch.randint(0, CFG.vocab_size, (1, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits, plain = scaled.model(tokens), load_checkpoint(path).model(tokens)
    assert logits.isfinite().all() and not torch.allclose(logits, plain)


@ROTARY
def test_init_model_config_takes_a_scaling_for_every_rotary_model(tmp_path, pos):
    cfg = init_model_config(_save_pos(tmp_path, pos), {"max_seq_len": 64, "rope_scaling": {"type": "linear",
                                                                                            "factor": 4.0}})
    assert cfg.pos == pos and cfg.max_seq_len == 64 and cfg.rope_scaling["original_max_seq_len"] == 16


@pytest.mark.parametrize("pos", ["alibi", ["nope", "alibi"]], ids=["alibi", "nope-alibi"])
def test_a_scaling_without_a_rotary_layer_is_one_line_naming_the_rotary_encodings(tmp_path, pos):
    path = _save_pos(tmp_path, pos)
    with pytest.raises(ValueError) as info:
        load_checkpoint(path, rope_scaling={"type": "yarn", "factor": 4})
    message = str(info.value)
    assert "\n" not in message and message.startswith("rope_scaling={'type': 'yarn', 'factor': 4} needs")
    assert f"pos={pos!r}" in message and f"layer: {' | '.join(encodings_with('rotary'))})" in message


def test_config_json_records_the_training_length_and_step(tmp_path):
    path = _save(tmp_path / "checkpoints", 7, _model(0))
    meta = json.loads((path / "config.json").read_text())
    assert (meta["step"], meta["train_seq_len"], meta["model"]) == (7, 16, CFG.to_dict())
    assert not any(name.startswith(".") for name in os.listdir(path.parent) if name != "latest")


def test_a_transformers_folder_or_a_corrupt_tokenizer_is_a_one_line_error(tmp_path):
    from nanoattn.hf import export_hf

    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2))
    export_hf(model, tmp_path / "hf")
    with pytest.raises(CheckpointError, match="transformers model folder.*import_hf"):
        load_checkpoint(tmp_path / "hf")
    ckpt = save_checkpoint(tmp_path / "ckpts", "000001", model, train_seq_len=32, step=1)
    (ckpt / "tokenizer.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json is corrupt"):
        load_checkpoint(ckpt)


# ----------------------------------------------------------------------------- paths and sizes


@pytest.mark.parametrize("pointer", ["../../other/checkpoints/000001", "/tmp", "000001/../../x", "a/000001"])
def test_latest_names_a_checkpoint_of_this_run_only(tmp_path, pointer):
    other = _save(tmp_path / "other" / "checkpoints", 1, _model(1))
    run = tmp_path / "run" / "checkpoints"
    _save(run, 2, _model(0))
    (run / "latest").write_text(pointer + "\n")
    with pytest.raises(CheckpointError, match=r"does not name a checkpoint directory inside .*checkpoints"):
        resolve_checkpoint(tmp_path / "run")
    assert other.is_dir()


def test_a_symlinked_latest_or_checkpoint_is_refused_without_echoing_its_target(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("password=hunter2\n")
    root = tmp_path / "run" / "checkpoints"
    _save(root, 1, _model(0))
    (root / "latest").unlink()
    (root / "latest").symlink_to(secret)
    with pytest.raises(CheckpointError) as err:
        resolve_checkpoint(tmp_path / "run")
    assert "hunter2" not in str(err.value) and "is not a plain file" in str(err.value)
    (root / "latest").unlink()
    elsewhere = _save(tmp_path / "elsewhere", 5, _model(1))
    (root / "000005").symlink_to(elsewhere, target_is_directory=True)
    (root / "latest").write_text("000005\n")
    with pytest.raises(CheckpointError, match="does not name a checkpoint directory"):
        resolve_checkpoint(tmp_path / "run")
    assert [p.name for p in list_checkpoints(root)] == ["000001"]  # never listed, so never pruned
    (root / "latest").write_text("000001\n")
    _save(root, 2, _model(0), keep_last=1)
    assert (elsewhere / "model.safetensors").exists()


def test_a_model_too_large_for_memory_is_refused_before_allocating(tmp_path):
    """config.json's sizes are not trusted: the whole model's parameters are checked against the
    machine's memory (16 GiB here) before one block is built, whatever field makes them large."""
    path = _save(tmp_path / "checkpoints", 1, _model(0))
    meta = json.loads((path / "config.json").read_text())
    code = ("import json, pathlib, resource, time\n"
            "import nanoattn.runtime\n"
            "from nanoattn import load_checkpoint\n"
            "nanoattn.runtime.device.memory_bytes = lambda device: 16 * 2**30\n"
            f"file = pathlib.Path({str(path / 'config.json')!r})\n"
            f"meta = json.loads({json.dumps(json.dumps(meta))})\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
            # [1e9, 32] float32 embeddings would be 128 GB; 1e8 layers 2.7 TB, and as modules far more.
            "for field, value in (('vocab_size', 1_000_000_000), ('n_layer', 100_000_000)):\n"
            "    file.write_text(json.dumps({**meta, 'model': {**meta['model'], field: value}}))\n"
            "    began = time.perf_counter()\n"
            "    try:\n"
            f"        load_checkpoint({str(path)!r})\n"
            "    except ValueError as e:\n"
            "        print(e, '|', round(time.perf_counter() - began, 1))\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    imported_kib, *messages, peak_kib = out.strip().splitlines()
    assert len(messages) == 2, out
    for message, field in zip(messages, ("vocab_size=1000000000", "n_layer=100000000"), strict=True):
        text, seconds = message.split(" | ")
        assert text.startswith(f"{path / 'config.json'}: model.{field} is invalid: a model of ")
        assert "needs at least" in text and text.endswith("more than the 16.0 GiB of cpu")
        assert float(seconds) < 1.0  # no block was built
    # Nothing of the model's size was allocated: the refusals add under 256 MiB to what the imports took.
    assert int(peak_kib) - int(imported_kib) < 256 * 1024


def test_a_shape_mismatch_is_refused_from_the_weights_header(tmp_path):
    path = _save(tmp_path / "checkpoints", 1, _model(0))
    meta = json.loads((path / "config.json").read_text())
    meta["model"]["vocab_size"] = 65
    (path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match=r"does not match the model config: tok_emb\.weight has shape "
                                              r"\[64, 32\] in the file, \[65, 32\] in the model$"):
        load_checkpoint(path)


def test_non_finite_or_non_float32_weights_are_refused(tmp_path):
    model = _model(0)
    path = _save(tmp_path / "checkpoints", 1, model)
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    state["blocks.0.attn.qkv.weight"][0, 0] = float("nan")
    save_file(state, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"blocks\.0\.attn\.qkv\.weight holds NaN or infinite values$"):
        load_checkpoint(path)
    state = {k: v.to(torch.float16) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, path / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"is F16, not float32"):
        load_checkpoint(path)


@pytest.mark.parametrize("content,message", [
    ("[1, 2]", "is not a nanoattn checkpoint config: it needs a 'model' mapping"),
    ('{"model": 3}', "is not a nanoattn checkpoint config: it needs a 'model' mapping"),
    ('{"model": {}, "step": "ten"}', "step='ten' is invalid: must be a non-negative integer"),
    ('{"model": {"d_model": "wide"}}', "model.d_model='wide' is invalid: must be a positive integer"),
])
def test_a_malformed_config_json_is_one_line(tmp_path, content, message):
    path = _save(tmp_path / "checkpoints", 1, _model(0))
    (path / "config.json").write_text(content)
    with pytest.raises(ValueError) as err:
        load_checkpoint(path)
    assert message in str(err.value) and "\n" not in str(err.value)
