"""Passkey retrieval: sample layout, scoring on a hand-built model, the training mix and its trainer hook."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from test_one_line_errors import run_script
from torch import nn

from nanoattn import GPT, ModelConfig, load_checkpoint
from nanoattn.checkpoint import save_checkpoint
from nanoattn.commands.eval_passkey import PasskeyEvalConfig, run_passkey_eval
from nanoattn.commands.eval_task import TaskEvalConfig
from nanoattn.config import DataConfig
from nanoattn.data import TokenData, ensure_prepared, load_tokenizer
from nanoattn.eval import PasskeyMix, evaluate_passkey, passkey_summary_table, passkey_table
from nanoattn.eval.passkey import PasskeyTemplate, score_passkey
from nanoattn.model import IGNORE_INDEX
from nanoattn.train import train
from nanoattn.validation import from_dict

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """A byte-tokenized corpus of 12 short plays of filler (one held out)."""
    root = tmp_path_factory.mktemp("passkey_data")
    docs = root / "docs"
    docs.mkdir()
    rng = np.random.default_rng(0)
    words = ["thou", "art", "more", "lovely", "and", "temperate", "rough", "winds", "do", "shake"]
    for i in range(12):
        (docs / f"doc{i:02d}.txt").write_text(" ".join(rng.choice(words, 600)) + "\n")
    cfg = DataConfig(name="tiny", corpus="text", paths=[str(docs)], root=str(root / "data"),
                     tokenizer={"type": "byte"}, val_fraction=0.1)
    return ensure_prepared(cfg)


def test_sample_layout(prepared):
    tokenizer = load_tokenizer(prepared)
    template = PasskeyTemplate(tokenizer)
    filler = np.arange(1000, dtype=np.int64) % 50 + 200  # non-ASCII bytes: ids the template never uses
    key = "40721"
    n_filler = 200 + 1 - template.overhead(key)
    for depth, cut in ((0.0, 0), (0.5, round(0.5 * n_filler)), (1.0, n_filler)):
        ids, key_tokens = template.sample(filler, 200, depth, key)
        assert ids.shape == (201,) and key_tokens == len(" 40721")  # byte tokens: one per character
        text = tokenizer.decode(ids.tolist())
        assert text.endswith(" What is the pass key? The pass key is 40721")
        stated = tokenizer.encode(" The pass key is 40721. Remember it.").ids
        assert ids[cut:cut + len(stated)].tolist() == stated  # after `cut` filler tokens
        assert ids[:cut].tolist() == filler[:cut].tolist() and (ids >= 200).sum() == n_filler
    with pytest.raises(ValueError, match="too short"):
        template.sample(filler, 40, 0.5, key)
    with pytest.raises(ValueError, match="depth=1.5"):
        template.sample(filler, 200, 1.5, key)


class NextIdModel(nn.Module):
    """A hand-built 'model': at every position it predicts (input id + 1) with logit margin `margin`."""

    def __init__(self, vocab: int, margin: float) -> None:
        super().__init__()
        self.vocab, self.margin = vocab, margin
        self.anchor = nn.Parameter(torch.zeros(()))  # gives the scorer a device

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.margin * nn.functional.one_hot((idx + 1) % self.vocab, self.vocab).float()  # [B, T, V]


def test_scoring_on_a_hand_built_case():
    vocab, margin = 10, 3.0
    model = NextIdModel(vocab, margin)
    # Key tokens are the last 3 ids. Row 0: 4 5 6 follow 3 as the model predicts; row 1: 9 breaks it.
    samples = torch.tensor([[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 6]])
    logprob, exact = score_passkey(model, samples, key_tokens=3)
    hit = -math.log(1 + (vocab - 1) * math.exp(-margin))  # log-softmax of the predicted id
    miss = hit - margin  # of any other id
    assert exact.tolist() == [True, False]
    assert logprob.tolist() == pytest.approx([3 * hit, hit + miss + miss])  # row 1 misses 9, then 6


def test_cells_cover_every_length_and_depth_and_learned_past_its_table_is_null(prepared):
    data = TokenData(prepared)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=data.vocab_size, d_model=32, n_layer=2, n_head=4, d_ff=64,
                            max_seq_len=128, pos="learned")).eval()
    cells = evaluate_passkey(model, data.tokenizer, data.tokens("val"), [128, 256], [0.0, 1.0], samples=3)
    assert [(c["length"], c["depth"]) for c in cells] == [(128, 0.0), (128, 1.0), (256, 0.0), (256, 1.0)]
    for cell in cells[:2]:
        assert 0 <= cell["accuracy"] <= 1 and cell["logprob"] < 0
    for cell in cells[2:]:
        assert cell["accuracy"] is None and "learned position table" in cell["error"]
    table = passkey_table({"results": cells})
    assert table.splitlines()[2] == f"| 0 | {cells[0]['accuracy']:.2f} | n/a |"
    summary = passkey_summary_table([{"results": cells}], ["learned"])
    mean = (cells[0]["accuracy"] + cells[1]["accuracy"]) / 2
    assert summary.splitlines() == ["| run | 128 | 256 |", "|---|---:|---:|",
                                    f"| learned | {mean:.2f} | n/a |"]
    # The same seed draws the same keys and filler: the numbers repeat exactly.
    again = evaluate_passkey(model, data.tokenizer, data.tokens("val"), [128, 256], [0.0, 1.0], samples=3)
    assert again == cells


def test_the_mix_is_deterministic_and_replaces_its_share_of_rows(prepared):
    data = TokenData(prepared)
    mix = PasskeyMix(data, 0.5)
    x, y = mix.train_batch(7, batch_size=4, seq_len=128, seed=3)
    plain_x, plain_y = data.train_batch(7, batch_size=4, seq_len=128, seed=3)
    again_x, _ = mix.train_batch(7, batch_size=4, seq_len=128, seed=3)
    assert torch.equal(x, again_x) and x.shape == y.shape == (4, 128)
    assert torch.equal(x[2:], plain_x[2:]) and torch.equal(y[2:], plain_y[2:])
    template = PasskeyTemplate(data.tokenizer)
    for row in range(2):
        text = data.tokenizer.decode(torch.cat([x[row], y[row, -1:]]).tolist())
        stated, asked = text.split("The pass key is")[1:]
        key = asked.strip()
        assert key.isdigit() and stated.startswith(f" {key}. Remember it.")
        # Only the key is scored: its tokens are the row's last targets, every other one is ignored.
        k = len(template.key_ids(key))
        assert torch.equal(y[row, -k:], x[row, 1 - k:].new_tensor(template.key_ids(key)))
        assert torch.all(y[row, :-k] == IGNORE_INDEX) and torch.equal(x[row, 1 - k:], y[row, -k:-1])
    assert mix.vocab_size == data.vocab_size and len(mix.val_batches(1, batch_size=2, seq_len=16)) == 1
    with pytest.raises(ValueError, match="passkey_fraction=0"):
        PasskeyMix(data, 0)


def test_the_trainer_uses_the_mix(prepared, tmp_path, monkeypatch):
    """train.passkey_fraction routes every training batch through PasskeyMix."""
    seen = []
    original = PasskeyMix.train_batch

    def spy(self, *args, **kwargs):
        seen.append(kwargs["seq_len"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PasskeyMix, "train_batch", spy)
    run = train({"out_dir": str(tmp_path / "run"),
                 "model": {"d_model": 32, "n_layer": 2, "n_head": 2, "d_ff": 64, "max_seq_len": 96},
                 "data": {"name": prepared.name, "corpus": "text", "root": str(prepared.parent),
                          "paths": [str(prepared.parent.parent / "docs")], "tokenizer": {"type": "byte"}},
                 "train": {"batch_size": 4, "max_steps": 3, "warmup_steps": 1, "eval_interval": 0,
                           "eval_steps": 1, "log_interval": 1, "dtype": "float32", "device": "cpu",
                           "passkey_fraction": 0.5},
                 "logger": {"type": "none"}})
    assert seen == [96, 96, 96] and load_checkpoint(run).step == 3


def test_the_report_and_the_script(prepared, tmp_path, monkeypatch, capsys):
    data = TokenData(prepared)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=data.vocab_size, d_model=32, n_layer=2, n_head=4, d_ff=64,
                            max_seq_len=96, pos="rope"))
    run = tmp_path / "rope_run"
    save_checkpoint(run / "checkpoints", "5", model, train_seq_len=96, step=5,
                    tokenizer_file=prepared / "tokenizer.json")
    report = run_passkey_eval(PasskeyEvalConfig(ckpt=str(run), multiples=[1, 2], depths=[0.5], samples=2,
                                                data_dir=str(prepared)))
    assert json.loads((run / "passkey.json").read_text()) == report
    assert (run / "passkey.png").stat().st_size > 5_000
    assert [c["length"] for c in report["results"]] == [96, 192]
    monkeypatch.chdir(tmp_path)
    assert run_script(monkeypatch, "eval_passkey", f"ckpt={run}", f"data_dir={prepared}", "lengths=[96]",
                      "depths=[0,1]", "samples=2", "rope_scaling={type:linear,factor:2}") is None
    assert (run / "passkey_linear2.json").exists() and "| depth | 96 |" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rope_run"]



def test_another_seed_writes_beside_the_earlier_report_and_other_settings_say_what_they_replace(
        prepared, tmp_path, capsys):
    data = TokenData(prepared)
    model = GPT(ModelConfig(vocab_size=data.vocab_size, d_model=32, n_layer=2, n_head=4, d_ff=64,
                            max_seq_len=96, pos="rope"))
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", "5", model, train_seq_len=96, step=5,
                    tokenizer_file=prepared / "tokenizer.json")
    fields = dict(ckpt=str(run), lengths=[96], depths=[0.5], samples=1, data_dir=str(prepared), plot=False)
    first = run_passkey_eval(PasskeyEvalConfig(**fields))
    seeded = run_passkey_eval(PasskeyEvalConfig(**fields, seed=3))
    assert json.loads((run / "passkey.json").read_text()) == first  # kept
    assert json.loads((run / "passkey_seed3.json").read_text()) == seeded and seeded["seed"] == 3
    assert capsys.readouterr().err == ""  # nothing replaced
    assert TaskEvalConfig(ckpt=str(run), seed=3).output() == run / "task_eval_seed3.json"  # eval_task alike
    out = str(tmp_path / "mine.json")
    run_passkey_eval(PasskeyEvalConfig(**fields, out=out))
    run_passkey_eval(PasskeyEvalConfig(**{**fields, "samples": 2}, seed=1, out=out))
    assert capsys.readouterr().err.splitlines() == [
        f"eval_passkey: replacing {out}, made with samples=1 (now 2), seed=0 (now 1)"]

def test_filler_from_data_of_another_tokenizer_is_refused(prepared, tmp_path):
    """Its ids would mean other tokens: the key and the filler would be garbage, silently."""
    from tokenizers import Tokenizer, models

    other = tmp_path / "other_tokenizer.json"
    Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1}, unk_token="[UNK]")).save(str(other))
    model = GPT(ModelConfig(vocab_size=TokenData(prepared).vocab_size, d_model=32, n_layer=2, n_head=4,
                            d_ff=64, max_seq_len=96))
    save_checkpoint(tmp_path / "run" / "checkpoints", "1", model, train_seq_len=96, step=1,
                    tokenizer_file=other)
    with pytest.raises(ValueError, match="holds another tokenizer than .*checkpoints.*tokenizer.json"):
        run_passkey_eval(PasskeyEvalConfig(ckpt=str(tmp_path / "run"), lengths=[96], samples=1,
                                           data_dir=str(prepared)))


@pytest.mark.parametrize(("values", "message"), [
    ({}, "eval_passkey.ckpt=None is invalid: required"),
    ({"ckpt": "r", "depths": [0, 1.5]}, "eval_passkey.depths=[0, 1.5] is invalid: 1.5 is not in [0, 1]"),
    ({"ckpt": "r", "depths": []}, "eval_passkey.depths=[] is invalid: must be a non-empty list"),
    ({"ckpt": "r", "samples": 0}, "eval_passkey.samples=0 is invalid: must be a positive integer"),
    ({"ckpt": "r", "seed": -1}, "eval_passkey.seed=-1 is invalid: must be an integer from 0 to 2**63 - 1"),
    ({"ckpt": "r", "batch_size": True}, "eval_passkey.batch_size=True is invalid: must be a positive"),
    ({"ckpt": "r", "depth": [0]}, "unknown key(s) eval_passkey.depth"),
])
def test_config_mistakes_are_one_line_errors(values, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        from_dict(PasskeyEvalConfig, values, owner="eval_passkey")


def test_the_config_is_the_dataclass(eval_schemas):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = OmegaConf.to_container(compose("eval_passkey", ["ckpt=runs/x", "depths=[0,1]"]))
    finally:
        GlobalHydra.instance().clear()
    assert from_dict(PasskeyEvalConfig, cfg, owner="eval_passkey") == PasskeyEvalConfig(ckpt="runs/x",
                                                                                       depths=(0, 1))
