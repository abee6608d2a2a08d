"""AdamW groups follow the decay rules; schedules equal their formulas at every step."""

import math

import pytest
import torch

from nanoattn import GPT, ModelConfig
from nanoattn.train.optim import lr_at, make_optimizer, param_groups


def _names(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize("pos,tie", [("learned", True), ("rope", False)])
def test_only_matmul_weights_decay_by_default(pos, tie):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=2, d_ff=64, max_seq_len=16, pos=pos,
                      norm="layernorm", mlp="gelu", bias=True, tie_embeddings=tie)
    model = GPT(cfg)
    decay, keep = param_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and keep["weight_decay"] == 0.0
    decayed, kept = _names(model, decay["params"]), _names(model, keep["params"])
    assert not decayed & kept
    assert decayed | kept == {n for n, _ in model.named_parameters()}
    assert len(decay["params"]) + len(keep["params"]) == len(list(model.parameters()))  # tied: once
    for name in decayed:
        assert name.endswith(".weight") and "norm" not in name and "emb" not in name and "table" not in name
    biases = {n for n, _ in model.named_parameters() if n.endswith("bias")}
    assert biases and biases <= kept
    assert "tok_emb.weight" in kept and all(n in kept for n in _names(model, model.norm.parameters()))
    if pos == "learned":
        assert "pos.table.weight" in kept
    if not tie:
        assert "lm_head.weight" in decayed


def test_decay_embeddings_moves_embeddings_to_the_decayed_group():
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq_len=16,
                            pos="learned"))
    decay, keep = param_groups(model, 0.1, decay_embeddings=True)
    assert {"tok_emb.weight", "pos.table.weight"} <= _names(model, decay["params"])
    assert all(p.ndim == 1 for p in keep["params"])


def test_the_sinusoidal_amplitude_is_not_decayed():
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq_len=16,
                            pos="sinusoidal"))
    decay, keep = param_groups(model, 0.1, decay_embeddings=True)
    assert "pos.scale" in _names(model, keep["params"])  # a gain: decay would pull it to 0, i.e. NoPE


def test_adamw_is_fused_on_cpu():
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq_len=16))
    opt = make_optimizer(model, lr=1e-3, weight_decay=0.1, betas=(0.9, 0.95), decay_embeddings=False,
                         device=torch.device("cpu"))
    assert opt.defaults["fused"] is True


KW = dict(lr=1.0, min_lr=0.1, warmup_steps=10, max_steps=110)


def test_warmup_is_linear_and_reaches_lr():
    for schedule in ("cosine", "wsd", "constant"):
        assert [lr_at(s, schedule=schedule, **KW) for s in range(10)] == pytest.approx(
            [(s + 1) / 10 for s in range(10)])


def test_cosine_formula():
    for s in range(10, 110):
        progress = (s - 10) / 99
        expected = 0.1 + 0.5 * (1 + math.cos(math.pi * progress)) * 0.9
        assert lr_at(s, schedule="cosine", **KW) == pytest.approx(expected)
    assert lr_at(10, schedule="cosine", **KW) == pytest.approx(1.0)
    assert lr_at(109, schedule="cosine", **KW) == pytest.approx(0.1)


def test_wsd_holds_then_decays_with_one_minus_sqrt():
    decay_start = 110 - 22  # decay_fraction 0.2 of 110 steps
    for s in range(10, decay_start):
        assert lr_at(s, schedule="wsd", decay_fraction=0.2, **KW) == 1.0
    for s in range(decay_start, 110):
        progress = (s - decay_start + 1) / 22
        assert lr_at(s, schedule="wsd", decay_fraction=0.2, **KW) == pytest.approx(
            0.1 + (1 - math.sqrt(progress)) * 0.9)
    assert lr_at(109, schedule="wsd", decay_fraction=0.2, **KW) == pytest.approx(0.1)


def test_constant_after_warmup():
    assert {lr_at(s, schedule="constant", **KW) for s in range(10, 110)} == {1.0}
