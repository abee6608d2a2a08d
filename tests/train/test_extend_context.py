"""Context extension runs (nanoattn/train/extend.py, configs/extend_context.yaml, scripts/extend_context.py).

A tiny RoPE model is trained for a few steps at BASE_LEN tokens on a seeded text corpus; the
tests extend it to twice that length and check the run's checkpoint: the scaling in its config
(original length = the base's training length), train_seq_len = the new length, the base's
other model fields kept. Every rotary model extends (xPos and Llama 4's iRoPE layout too, under every
scaling fine-tuning allows). The refusals (dynamic, a model without a rotary layer, no scaling, not
longer, model fields beyond the two an extension sets) are checked before anything is written.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf
from test_one_line_errors import expect_one_line, run_script

from nanoattn import GPT, ModelConfig, load_checkpoint
from nanoattn.checkpoint import save_checkpoint
from nanoattn.positional import encodings_with
from nanoattn.positional.rope_scaling import normalize_rope_scaling
from nanoattn.positional.rope_scaling_params import SCALING_TYPES
from nanoattn.train import train
from nanoattn.train.extend import FINE_TUNE_TYPES, extend_context, extension_config

REPO = Path(__file__).resolve().parents[2]
BASE_LEN = 16
LONG_LEN = 2 * BASE_LEN
WORDS = ("the", "king", "queen", "lord", "sweet", "night", "love", "death", "crown", "sword", "thou", "art")
TINY_MODEL = dict(vocab_size=256, d_model=32, n_layer=2, n_head=2, n_kv_head=1, d_ff=64, max_seq_len=BASE_LEN,
                  pos="rope", rope_theta=5000.0)  # a non-default theta: the extension must keep it
TINY_TRAIN = dict(batch_size=2, max_steps=3, warmup_steps=1, eval_interval=0, eval_steps=1, log_interval=1,
                  ckpt_interval=0, dtype="float32")


def write_corpus(folder: Path) -> list[str]:
    folder.mkdir(parents=True)
    rng = random.Random(0)
    paths = []
    for i in range(6):
        path = folder / f"doc{i}.txt"
        path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(8)) for _ in range(60)) + "\n")
        paths.append(str(path))
    return paths


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("extend_data")
    return dict(name="tiny", corpus="text", paths=write_corpus(tmp / "corpus"), root=str(tmp / "data"),
                tokenizer={"type": "byte"})


@pytest.fixture(scope="module")
def base_run(tmp_path_factory, data) -> Path:
    out = tmp_path_factory.mktemp("extend_base") / "base"
    return train({"out_dir": str(out), "model": TINY_MODEL, "data": data,
                  "train": {**TINY_TRAIN, "seq_len": BASE_LEN}, "logger": {"type": "none"}})


# Rotary models beyond pos=rope, each with the model fields it changes.
ROTARY_BASES = {"xpos": {"pos": "xpos"}, "irope": {"pos": ["rope", "rope", "rope", "nope"], "n_layer": 4}}


@pytest.fixture(scope="module", params=sorted(ROTARY_BASES))
def rotary_base(request, tmp_path_factory, data) -> Path:
    out = tmp_path_factory.mktemp("extend_base") / request.param
    return train({"out_dir": str(out), "model": {**TINY_MODEL, **ROTARY_BASES[request.param]}, "data": data,
                  "train": {**TINY_TRAIN, "seq_len": BASE_LEN}, "logger": {"type": "none"}})


def fine_tune_scaling(kind: str) -> dict[str, Any]:
    scaling: dict[str, Any] = {"type": kind, "factor": 2.0}
    if kind == "longrope":  # one divisor per rotated pair: head_dim 16 has 8
        scaling.update(short_factor=[1.0] * 8, long_factor=[1.0 + i / 4 for i in range(8)])
    return scaling


def extension(base: Path, out: Path, data: dict[str, Any], scaling: dict[str, Any] | None, **train_fields):
    return {"out_dir": str(out), "model": {"rope_scaling": scaling}, "data": data,
            "train": {**TINY_TRAIN, "init_from": str(base), "seq_len": LONG_LEN, "lr": 3e-4, **train_fields},
            "logger": {"type": "none"}}


@pytest.mark.parametrize("kind", ["linear", "yarn"])
def test_extension_run_carries_the_scaling_and_the_new_length(base_run, data, tmp_path, kind):
    scaling = {"type": kind, "factor": 2.0}
    run_dir = extend_context(extension(base_run, tmp_path / "ext", data, scaling))
    assert run_dir == tmp_path / "ext" and (run_dir / "config.yaml").exists()
    ckpt = load_checkpoint(run_dir)
    expected = normalize_rope_scaling({**scaling, "original_max_seq_len": BASE_LEN}, LONG_LEN)
    assert ckpt.config.rope_scaling == expected
    assert ckpt.train_seq_len == LONG_LEN and ckpt.config.max_seq_len == LONG_LEN
    assert ckpt.step == TINY_TRAIN["max_steps"]
    saved = json.loads((ckpt.path / "config.json").read_text())
    assert saved["model"]["rope_scaling"] == expected and saved["train_seq_len"] == LONG_LEN
    base = load_checkpoint(base_run)
    assert ckpt.config.rope_theta == base.config.rope_theta == TINY_MODEL["rope_theta"]
    assert {k: v for k, v in ckpt.config.to_dict().items() if k not in ("rope_scaling", "max_seq_len")} == {
        k: v for k, v in base.config.to_dict().items() if k not in ("rope_scaling", "max_seq_len")}
    # It fine-tuned the base's weights: same tensors, moved by the updates, not re-initialised.
    tuned, start = ckpt.model.state_dict(), base.model.state_dict()
    assert not torch.equal(tuned["tok_emb.weight"], start["tok_emb.weight"])
    assert (tuned["tok_emb.weight"] - start["tok_emb.weight"]).abs().max() < 0.05
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("val_loss" in r for r in records) and records[-1]["step"] == TINY_TRAIN["max_steps"]


def test_every_scaling_but_dynamic_fine_tunes():
    assert FINE_TUNE_TYPES.split(" | ") == [kind for kind in SCALING_TYPES if kind != "dynamic"]


@pytest.mark.parametrize("kind", FINE_TUNE_TYPES.split(" | "))
def test_every_rotary_model_extends_under_every_fine_tuning_scaling(rotary_base, data, tmp_path, kind):
    scaling = fine_tune_scaling(kind)
    run_dir = extend_context(extension(rotary_base, tmp_path / "ext", data, scaling, max_steps=1))
    ckpt, base = load_checkpoint(run_dir), load_checkpoint(rotary_base)
    expected = normalize_rope_scaling({**scaling, "original_max_seq_len": BASE_LEN}, LONG_LEN)
    assert ckpt.config.rope_scaling == expected and ckpt.train_seq_len == LONG_LEN
    assert ckpt.config.pos == base.config.pos and ckpt.config.n_layer == base.config.n_layer
    rotary = [layer for layer in range(ckpt.config.n_layer) if ckpt.model.pos.for_layer(layer).rotary]
    assert rotary and all(ckpt.model.pos.for_layer(layer).scaling == expected for layer in rotary)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in records if "train_loss" in r]
    assert records[-1]["step"] == 1 and losses and all(math.isfinite(loss) for loss in losses)


def compose_extension(overrides: list[str]) -> dict[str, Any]:
    """configs/extend_context.yaml composed as the script composes it, resolved to plain containers."""
    script = REPO / "scripts" / "extend_context.py"
    spec = importlib.util.spec_from_file_location("extend_context_script", script)
    sys.path.insert(0, str(script.parent))  # the script imports its sibling _hydra_cli
    try:
        spec.loader.exec_module(importlib.util.module_from_spec(spec))  # registers extend_context_schema
    finally:
        sys.path.remove(str(script.parent))
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            return OmegaConf.to_container(compose("extend_context", overrides=overrides), resolve=True)
    finally:
        GlobalHydra.instance().clear()


def test_the_shipped_recipe(base_run):
    # ckpt= as every command names a checkpoint, train.init_from= as train.py does; one out_dir, as the
    # default is stamped to the second, which may turn between the two compositions.
    run = extension_config(compose_extension([f"ckpt={base_run}", "out_dir=runs/x"]))
    assert run == extension_config(compose_extension([f"train.init_from={base_run}", "out_dir=runs/x"]))
    with pytest.raises(ValueError, match=r"^ckpt='\S+' and train.init_from='elsewhere' name two checkpoints"):
        extension_config(compose_extension([f"ckpt={base_run}", "train.init_from=elsewhere"]))
    assert run.model.rope_scaling == normalize_rope_scaling(
        {"type": "yarn", "factor": 4.0, "original_max_seq_len": BASE_LEN}, 512)
    assert run.seq_len == run.model.max_seq_len == 512
    assert run.train.init_from == str(base_run) and run.train.max_steps == 200 and run.train.lr == 3e-4
    explicit = extension_config(compose_extension([f"train.init_from={base_run}",
                                                   "model.rope_scaling.original_max_seq_len=8"]))
    assert explicit.model.rope_scaling["original_max_seq_len"] == 8
    # The model node holds only the two extension fields: any other model key fails at composition.
    with pytest.raises(ConfigCompositionException, match="model.d_model"):
        compose_extension([f"train.init_from={base_run}", "model.d_model=64"])


def test_the_shipped_recipe_takes_every_rotary_model(rotary_base):
    run = extension_config(compose_extension([f"train.init_from={rotary_base}"]))
    assert run.model.pos == load_checkpoint(rotary_base).config.pos and run.model.rotary
    assert run.model.rope_scaling == normalize_rope_scaling(
        {"type": "yarn", "factor": 4.0, "original_max_seq_len": BASE_LEN}, 512)


def test_the_config_composes_into_an_extension_run(base_run, data, tmp_path):
    overrides = [f"train.init_from={base_run}", f"train.seq_len={LONG_LEN}", "model.rope_scaling.type=linear",
                 "model.rope_scaling.factor=2", f"out_dir={tmp_path / 'ext'}", "logger=none", "data=text",
                 f"data.paths=[{','.join(data['paths'])}]", f"data.root={data['root']}", "data.name=tiny",
                 "data.tokenizer.type=byte", *(f"train.{k}={v}" for k, v in TINY_TRAIN.items())]
    ckpt = load_checkpoint(extend_context(compose_extension(overrides)))
    assert ckpt.config.rope_scaling == normalize_rope_scaling(
        {"type": "linear", "factor": 2.0, "original_max_seq_len": BASE_LEN}, LONG_LEN)
    assert ckpt.train_seq_len == LONG_LEN


def test_original_length_defaults_to_the_unscaled_training_length(base_run, data, tmp_path):
    explicit = extension_config(extension(base_run, tmp_path / "a", data,
                                          {"type": "yarn", "factor": 4.0, "original_max_seq_len": 8}))
    assert explicit.model.rope_scaling["original_max_seq_len"] == 8
    spelt = extension_config(extension(base_run, tmp_path / "a", data, {  # transformers' key, ours null
        "type": "yarn", "factor": 4.0, "original_max_seq_len": None, "original_max_position_embeddings": 8}))
    assert spelt.model.rope_scaling["original_max_seq_len"] == 8
    # A checkpoint extended before (16 -> 32 by linear x2): a new scaling replaces its scaling and
    # is measured from the same unscaled length 16, not from the 32 it was fine-tuned at.
    torch.manual_seed(0)
    earlier = {"type": "linear", "factor": 2.0, "original_max_seq_len": BASE_LEN}
    extended = GPT(ModelConfig(**{**TINY_MODEL, "max_seq_len": LONG_LEN}, rope_scaling=earlier))
    save_checkpoint(tmp_path / "extended" / "checkpoints", "1", extended, train_seq_len=LONG_LEN, step=1)
    again = extension_config(extension(tmp_path / "extended", tmp_path / "b", data,
                                       {"type": "linear", "factor": 4.0}, seq_len=2 * LONG_LEN))
    assert again.model.rope_scaling == normalize_rope_scaling(
        {"type": "linear", "factor": 4.0, "original_max_seq_len": BASE_LEN}, 2 * LONG_LEN)


def refusal(run: dict[str, Any], out: Path) -> str:
    with pytest.raises(ValueError) as info:
        extend_context(run)
    assert not out.exists()  # refused before anything is written
    assert "\n" not in str(info.value)
    return str(info.value)


def test_dynamic_is_refused_for_fine_tuning(base_run, data, tmp_path):
    message = refusal(extension(base_run, tmp_path / "ext", data, {"type": "dynamic", "factor": 2.0}),
                      tmp_path / "ext")
    assert message.startswith("model.rope_scaling.type='dynamic' is invalid for fine-tuning")
    assert "linear | ntk | yarn | llama3" in message


@pytest.mark.parametrize("pos", ["learned", "alibi", ["nope", "alibi"]], ids=["learned", "alibi", "layout"])
def test_a_checkpoint_without_a_rotary_layer_is_refused(data, tmp_path, pos):
    save_checkpoint(tmp_path / "base" / "checkpoints", "1", GPT(ModelConfig(**{**TINY_MODEL, "pos": pos})),
                    train_seq_len=BASE_LEN, step=1)
    message = refusal(extension(tmp_path / "base", tmp_path / "ext", data, {"type": "linear", "factor": 2.0}),
                      tmp_path / "ext")
    assert f"pos={pos!r}" in message and "RoPE" in message
    assert f"a rotary encoding in some layer: {' | '.join(encodings_with('rotary'))})" in message


@pytest.mark.parametrize("change,named", [
    (lambda run: run["model"].update(rope_scaling=None), "model.rope_scaling=None"),
    (lambda run: run["model"].update(rope_theta=1e6), "model.rope_theta cannot be set"),
    (lambda run: run["train"].update(seq_len=BASE_LEN), f"train.seq_len={BASE_LEN} is invalid"),
    (lambda run: run["train"].pop("seq_len"), "train.seq_len is missing"),
    (lambda run: run["train"].pop("init_from"), "ckpt is missing: set it to the checkpoint"),
    (lambda run: run["model"].update(rope_scaling={"type": "yarn", "factor": 0.5}),
     "model.rope_scaling.factor=0.5"),
], ids=["no-scaling", "model-field", "not-longer", "no-seq-len", "no-init-from", "bad-factor"])
def test_bad_extensions_are_one_line_errors(base_run, data, tmp_path, change, named):
    run = extension(base_run, tmp_path / "ext", data, {"type": "linear", "factor": 2.0})
    change(run)
    assert named in refusal(run, tmp_path / "ext")


def test_script_reports_a_refusal_in_one_line(base_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    expect_one_line(run_script(monkeypatch, "extend_context", f"ckpt={base_run}",
                               "model.rope_scaling.type=dynamic", f"out_dir={tmp_path / 'ext'}"),
                    r"model\.rope_scaling\.type='dynamic' is invalid for fine-tuning")
    assert list(tmp_path.iterdir()) == []  # Hydra wrote nothing either
