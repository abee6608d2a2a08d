"""KERPLE (Chi et al. 2022) against the paper and the authors' code.

The kernels against the paper's formulas written out in float64: nanoattn/references. Here:
one (r1, r2) per head for the whole model, shared by every layer; the range kept by projecting the
stored parameters after each update, through the training step's own function.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from torch import nn

from nanoattn import GPT, ModelConfig
from nanoattn.positional.kerple import EPS
from nanoattn.train.step import optimizer_step

KERNELS = ["kerple_log", "kerple_power"]
H = 4
# The paper's ranges: r1 > 0 for both; r2 > 0 for the log kernel, 0 < r2 <= 2 for the power kernel.
R2_MAX = {"kerple_log": None, "kerple_power": 2.0}


def tiny_model(pos, n_layer: int = 2) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=32, d_model=32, n_layer=n_layer, n_head=H, d_ff=64, max_seq_len=32,
                           pos=pos))


def kerple(model: GPT):
    """The model's KERPLE encoding, alone or in a layout."""
    return model.pos.for_layer(0) if isinstance(model.cfg.pos, list) else model.pos


def set_kerple(enc, r1, r2) -> None:
    with torch.no_grad():
        enc.r1.copy_(torch.tensor(r1))
        enc.r2.copy_(torch.tensor(r2))


def bias(enc, q_positions, k_positions, layer=0):
    return enc.bias(None, None, torch.tensor(q_positions), torch.tensor(k_positions), layer)


def paper(name: str, r1: float, r2: float, d: int) -> float:
    """The paper's kernels of the distance d = m - n >= 0, in float64."""
    return -r1 * math.log(1 + r2 * d) if name == "kerple_log" else -r1 * d ** r2


@pytest.mark.parametrize("name", KERNELS)
def test_the_bias_is_float32_per_head_and_the_power_kernel_at_r2_1_is_alibi(name):
    enc = kerple(tiny_model(name))
    set_kerple(enc, [0.5, 1.0, 1.5, 2.5], [1.0] * H)
    got = bias(enc, [0, 5, 1000], [0, 4, 999])  # [H, Tq, Tk]
    assert got.dtype == torch.float32 and got.shape == (H, 3, 3)
    if name == "kerple_power":  # r2 = 1 is ALiBi with slope r1
        torch.testing.assert_close(bias(enc, [9], list(range(10)))[1, 0], -torch.arange(9, -1, -1.0))


@pytest.mark.parametrize("name", KERNELS)
def test_the_forward_uses_the_stored_parameters_as_they_are(name):
    # The range is the projection's job (after each update): the forward neither clamps the value
    # nor reroutes its gradient, so r1's gradient is the kernel's own, the distance term.
    enc = kerple(tiny_model(name))
    set_kerple(enc, [-0.5, 0.5, 1.0, 1.0], [1.0] * H)
    got = bias(enc, [10], [0])[:, 0, 0]  # [H]
    assert got[0].item() == pytest.approx(paper(name, -0.5, 1.0, 10), rel=1e-6)  # positive: r1 < 0 as stored
    got.sum().backward()
    torch.testing.assert_close(enc.r1.grad, torch.full((H,), paper(name, 1.0, 1.0, 10)))


@pytest.mark.parametrize("name", KERNELS)
def test_one_parameter_set_per_model_shared_by_every_layer_whatever_the_depth(name):
    added = {}
    for n_layer in (2, 6):
        model, nope = tiny_model(name, n_layer), tiny_model("nope", n_layer)
        added[n_layer] = model.num_params() - nope.num_params()
        assert {n: p.shape for n, p in model.pos.named_parameters()} == {"r1": (H,), "r2": (H,)}
    assert added[2] == added[6] == 2 * H
    # In a layout the encoding's layers (0, 2, 4 of 6) share the one set: the same bias in each.
    model = tiny_model([name, "nope"], n_layer=6)
    assert model.num_params() - tiny_model("nope", 6).num_params() == 2 * H
    enc = model.pos.for_layer(0)
    assert model.pos.for_layer(2) is enc and model.pos.for_layer(4) is enc
    first = bias(enc, [5, 9], list(range(10)), layer=0)
    for layer in (2, 4):
        torch.testing.assert_close(bias(enc, [5, 9], list(range(10)), layer=layer), first, atol=0, rtol=0)


class Push(nn.Module):
    """A loss linear in r1 and r2, as ``optimizer_step`` calls its net: (x, y) -> loss. Its
    gradient is ``r1_grad`` and ``r2_grad``, so plain SGD at lr 1 subtracts them exactly."""

    def __init__(self, enc, r1_grad, r2_grad) -> None:
        super().__init__()
        self.enc, self.r1_grad, self.r2_grad = enc, torch.tensor(r1_grad), torch.tensor(r2_grad)

    def forward(self, x, y):
        return (self.r1_grad * self.enc.r1).sum() + (self.r2_grad * self.enc.r2).sum()


@pytest.mark.parametrize("layout", [False, True])
@pytest.mark.parametrize("name", KERNELS)
def test_an_update_past_a_bound_leaves_the_stored_parameter_exactly_on_it(name, layout):
    model = tiny_model([name, "nope"] if layout else name)  # in a layout the step must still reach it
    enc = kerple(model)
    set_kerple(enc, [0.5, 0.5, 1.0, 1.0], [0.5, 1.5, 1.0, 1.0])
    # Head 0: r1 and r2 pushed below eps (to -0.5); head 1: r2 pushed to 2.5, past the power
    # kernel's bound 2 (the log kernel's r2 has none); heads 2, 3: not moved.
    net = Push(enc, [1.0, -1.0, 0.0, 0.0], [1.0, -1.0, 0.0, 0.0])
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    batch = (torch.zeros(1, 1, dtype=torch.long),) * 2
    optimizer_step(net, model, optimizer, [batch], grad_clip=0.0, autocast=contextlib.nullcontext)
    high = R2_MAX[name]
    # Exactly the bound (float32, as clamp_ writes it), or exactly the SGD result where no bound
    # was crossed (0.5 -/+ 1 and 1.5 + 1 are exact in float32).
    assert torch.equal(enc.r1.detach(), torch.tensor([EPS, 1.5, 1.0, 1.0]))
    assert torch.equal(enc.r2.detach(), torch.tensor([EPS, 2.5 if high is None else high, 1.0, 1.0]))


@pytest.mark.parametrize("name", KERNELS)
def test_initial_values_are_the_authors_uniform_draws_projected_into_range(name):
    enc = kerple(GPT(ModelConfig(d_model=64, n_layer=1, n_head=64, pos=name)))
    r1_top, r2_top = (2.0, 1.0) if name == "kerple_log" else (1.0, 2.0)
    for p, top in ((enc.r1, r1_top), (enc.r2, r2_top)):
        assert EPS <= p.min() and p.max() <= top and p.max() > top / 2
