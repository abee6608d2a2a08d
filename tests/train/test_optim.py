"""AdamW groups follow the decay rules; Muon takes the blocks' matrices and nothing else; schedules
equal their formulas at every step."""

import math

import pytest
import torch
from torch import nn

from nanoattn import GPT, PRESETS, ModelConfig, preset
from nanoattn.checkpoint import load_trainer_state
from nanoattn.train import train
from nanoattn.train.optim import (
    OptimizerPair,
    StackedMuon,
    lr_at,
    make_optimizer,
    muon_params,
    param_groups,
    scaled_groups,
)


def _names(model, params):
    ids = {id(p) for p in params}
    return {n for n, p in model.named_parameters() if id(p) in ids}


@pytest.mark.parametrize("pos,tie,value_embeds", [("learned", True, 0), ("rope", False, 1)])
def test_only_matmul_weights_decay_by_default(pos, tie, value_embeds):
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=2, d_ff=64, max_seq_len=16, pos=pos,
                      norm="layernorm", mlp="gelu", bias=True, tie_embeddings=tie, value_embeds=value_embeds,
                      token_shift=not tie)
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
    if value_embeds:  # the tables are embeddings and their mixes scalars
        assert {"value_emb.0.weight", "blocks.0.attn.value_mix", "blocks.1.attn.value_mix"} <= kept
    if cfg.token_shift:  # a gain: decay would pull it to 0, i.e. no shift
        assert "shift_gate" in kept


def test_decay_embeddings_moves_embeddings_to_the_decayed_group():
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq_len=16,
                            pos="learned"))
    decay, keep = param_groups(model, 0.1, decay_embeddings=True)
    assert {"tok_emb.weight", "pos.table.weight"} <= _names(model, decay["params"])
    assert all(p.ndim == 1 for p in keep["params"])


def test_the_sinusoidal_scaled_amplitude_is_not_decayed():
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq_len=16,
                            pos="sinusoidal_scaled"))
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


def test_cosine_over_decay_steps_then_holds_min_lr_whatever_max_steps():
    for max_steps in (60, 110, 1000):
        rates = [lr_at(s, schedule="cosine", **{**KW, "max_steps": max_steps}, decay_steps=60)
                 for s in range(max_steps)]
        assert rates[:60] == pytest.approx([lr_at(s, schedule="cosine", **{**KW, "max_steps": 60})
                                            for s in range(60)])
        assert rates[59:] == pytest.approx([0.1] * (max_steps - 59))


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


@pytest.mark.parametrize("name", PRESETS)
def test_muon_takes_the_blocks_matrices_and_adamw_everything_else_on_every_preset(name):
    with torch.device("meta"):  # a 7B model without memory
        model = GPT(preset(name))
    muon = _names(model, muon_params(model))
    up = "mlp.gate_up" if model.cfg.mlp == "swiglu" else "mlp.up"
    linear = {f"blocks.{i}.{n}.weight" for i in range(model.cfg.n_layer)
              for n in ("attn.qkv", "attn.proj", up, "mlp.down")}
    assert muon == linear  # the attention and MLP matrices of every block, nothing else
    rest = {n: p for n, p in model.named_parameters() if n not in muon}
    assert "tok_emb.weight" in rest
    assert all(p.ndim == 1 for n, p in rest.items() if n.startswith("blocks."))  # norms and biases
    if not model.cfg.tie_embeddings:
        assert "lm_head.weight" in rest


def test_muon_and_adamw_step_together_with_their_learning_rates_and_one_state_dict():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16,
                            pos="learned", tie_embeddings=False))  # AdamW decays the untied head
    opt = make_optimizer(model, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), decay_embeddings=False,
                         device=torch.device("cpu"), optimizer="muon", muon_lr_scale=2.0,
                         muon_weight_decay=0.0)
    assert isinstance(opt, OptimizerPair)
    muon, adamw = opt.optimizers
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert [g["lr_scale"] for g in opt.param_groups] == [2.0, 1.0, 1.0] and muon.param_groups[0]["lr"] == 0.02
    assert muon.param_groups[0]["weight_decay"] == 0.0 and adamw.param_groups[0]["weight_decay"] == 0.1
    counted = [p for g in opt.param_groups for p in g["params"]]
    assert len(counted) == len({id(p) for p in counted}) == len(list(model.parameters()))  # each once
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    idx = torch.randint(0, 64, (4, 16))
    model.loss(idx[:, :-1], idx[:, 1:]).backward()
    opt.step()
    opt.zero_grad()
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {n for n, _ in model.named_parameters()}  # both optimizers stepped
    state = opt.state_dict()
    assert set(state) == {"muon", "adamw"} and len(state["muon"]["state"]) == 8
    with pytest.raises(ValueError, match="train.optimizer=muon needs its muon and adamw states"):
        opt.load_state_dict(adamw.state_dict())


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("adjust_lr_fn", ["original", "match_rms_adamw"])
def test_stacked_muon_makes_torchs_muon_updates_and_state(nesterov, adjust_lr_fn):
    """StackedMuon over matrices of repeated, tall, wide and square shapes moves them as torch.optim.Muon
    does, and keeps the same state: a checkpoint of either resumes in the other. Both orthogonalise in
    bf16 by the same products, batched or one by one; a CPU whose batched kernel sums in another order
    may round them apart by bf16's unit (2^-8) per iteration, so the bound is that share of each update."""
    shapes = [(48, 16), (16, 16), (16, 48), (48, 16), (16, 16), (16, 48), (8, 24)]
    torch.manual_seed(0)
    ours = [nn.Parameter(torch.randn(*shape) * 0.02) for shape in shapes]
    theirs = [nn.Parameter(p.detach().clone()) for p in ours]
    initial = [p.detach().clone() for p in ours]
    settings = dict(lr=0.02, weight_decay=0.1, momentum=0.9, nesterov=nesterov, adjust_lr_fn=adjust_lr_fn)
    stacked, reference = StackedMuon(ours, **settings), torch.optim.Muon(theirs, **settings)
    steps = 3
    for _ in range(steps):
        for a, b in zip(ours, theirs, strict=True):
            a.grad = torch.randn_like(a)
            b.grad = a.grad.clone()
        stacked.step()
        reference.step()
    for a, b, start, (rows, cols) in zip(ours, theirs, initial, shapes, strict=True):
        ratio = (math.sqrt(max(1, rows / cols)) if adjust_lr_fn == "original"
                 else 0.2 * math.sqrt(max(rows, cols)))
        bound = steps * 0.02 * ratio * 5 * 2**-8  # rate x NS iterations x bf16's unit, per step
        torch.testing.assert_close(a, b, rtol=0, atol=bound)
        assert (a - start).abs().max() > 4 * bound  # the updates themselves are far larger
    state = stacked.state_dict()
    reference.load_state_dict(state)
    assert [sorted(v) for v in state["state"].values()] == [["momentum_buffer"]] * len(shapes)
    assert state["param_groups"][0].keys() == reference.state_dict()["param_groups"][0].keys()


def test_embedding_and_head_rates_are_set_apart_and_a_tied_head_follows_the_token_table():
    fields = dict(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16, pos="learned",
                  value_embeds=1, token_shift=True)
    untied = GPT(ModelConfig(**fields, tie_embeddings=False))
    opt = make_optimizer(untied, lr=1e-2, weight_decay=0.1, betas=(0.9, 0.95), decay_embeddings=False,
                         device=torch.device("cpu"), optimizer="muon", muon_lr_scale=2.0,
                         embedding_lr_scale=10.0, head_lr_scale=0.5)
    scale = {n: g["lr_scale"] for g in opt.param_groups for n in _names(untied, g["params"])}
    decay = {n: g["weight_decay"] for g in opt.param_groups for n in _names(untied, g["params"])}
    assert len(scale) == len(list(untied.parameters()))  # each parameter in one group
    tables = {"tok_emb.weight", "value_emb.0.weight", "pos.table.weight"}
    assert {n for n, s in scale.items() if s == 10.0} == tables and {decay[n] for n in tables} == {0.0}
    assert scale["lm_head.weight"] == 0.5 and decay["lm_head.weight"] == 0.1  # the head still decays
    assert {n for n, s in scale.items() if s == 2.0} == _names(untied, muon_params(untied))
    assert all(s == 1.0 for n, s in scale.items() if "norm" in n or "value_mix" in n)
    assert scale["shift_gate"] == 1.0 and decay["shift_gate"] == 0.0  # a gain, not an embedding

    tied = GPT(ModelConfig(**fields))
    groups = scaled_groups(tied, param_groups(tied, 0.1), embedding_lr_scale=10.0)
    assert {n for g in groups if g["lr_scale"] == 10.0 for n in _names(tied, g["params"])} == tables
    # At scale 1 the groups are param_groups' two, unsplit.
    plain = scaled_groups(tied, param_groups(tied, 0.1))
    assert [(g["weight_decay"], g["lr_scale"]) for g in plain] == [(0.1, 1.0), (0.0, 1.0)]
    assert [g["params"] for g in plain] == [g["params"] for g in param_groups(tied, 0.1)]


def test_training_steps_each_group_at_its_scale_of_the_schedule(tmp_path, tiny_config):
    run_dir = train(tiny_config(tmp_path / "run", model={"tie_embeddings": False}, optimizer="muon",
                                schedule="constant", embedding_lr_scale=10.0, head_lr_scale=0.5,
                                muon_lr_scale=2.0))
    state = load_trainer_state(run_dir)["optimizer"]
    groups = state["muon"]["param_groups"] + state["adamw"]["param_groups"]
    # The untied head (decayed), the norms, Muon's matrices, the token table (neither decayed).
    assert sorted(g["lr_scale"] for g in groups) == [0.5, 1.0, 2.0, 10.0]
    assert all(g["lr"] == pytest.approx(3e-3 * g["lr_scale"]) for g in groups)
