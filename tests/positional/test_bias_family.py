"""The learned relative-bias family against hand computations and references.

References: T5's buckets and FIRE's normalised distance computed by hand at chosen positions and
parameter values, FIRE's MLP written out unit by unit (each whole bias against transformers' T5 and
FIRE's formula: nanoattn/references; KERPLE: test_kerple.py). Then the properties every one
of them needs in a model: per-layer parameters that really are per layer, one-line config errors,
gradients reaching every parameter, and a tiny model that learns.
"""

from __future__ import annotations

import math

import pytest
import torch
from fitting import fit

from nanoattn import GPT, ModelConfig
from nanoattn.positional import build_positional
from nanoattn.positional.fire import FIRELayer
from nanoattn.positional.t5 import t5_causal_bucket
from nanoattn.train.optim import param_groups

NAMES = ["t5", "kerple_log", "kerple_power", "fire"]
PER_LAYER = ["fire"]  # KERPLE and T5 share one set across layers (test_kerple.py, the T5 test)
H = 4


def encoding(name: str, **fields):
    torch.manual_seed(0)
    cfg = dict(d_model=32, n_layer=2, n_head=H, max_seq_len=32, pos=name)
    return build_positional(ModelConfig(**{**cfg, **fields}))


def grid(q_positions, k_positions):
    return torch.tensor(q_positions), torch.tensor(k_positions)


def bias(enc, q_positions, k_positions, layer=0):
    return enc.bias(None, None, *grid(q_positions, k_positions), layer)


def tiny_model(pos, **fields) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=32, d_model=32, n_layer=2, n_head=H, d_ff=64, max_seq_len=32,
                           pos=pos, **fields))


# --- T5 -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (8, 20), (33, 100), (2, 4), (16, 9)])
def test_t5_buckets_are_half_exact_then_log_spaced_up_to_max_distance(num_buckets, max_distance):
    exact = num_buckets // 2
    assert t5_causal_bucket(torch.arange(exact), num_buckets, max_distance).tolist() == list(range(exact))
    assert t5_causal_bucket(torch.tensor([max_distance, 10**6]), num_buckets, max_distance).tolist() == \
        [num_buckets - 1] * 2


def test_t5_bias_is_each_heads_scalar_of_the_distance_bucket_shared_by_layers():
    enc = encoding("t5", t5_num_buckets=8, t5_max_distance=20)
    assert [name for name, _ in enc.named_parameters()] == ["table.weight"]
    with torch.no_grad():
        enc.table.weight.copy_(torch.arange(8 * H, dtype=torch.float32).view(8, H))  # [bucket, head]
    # Buckets by hand: distances 0..3 are exact; then 4 + floor(log(d / 4) / log(20 / 4) * 4), at most 7.
    by_hand = {0: 0, 1: 1, 3: 3, 4: 4, 5: 4, 6: 5, 9: 6, 13: 6, 14: 7, 19: 7, 20: 7, 500: 7}
    for d, bucket in by_hand.items():
        assert (d if d < 4 else min(4 + math.floor(math.log(d / 4) / math.log(5) * 4), 7)) == bucket
    q, ks = 600, [600 - d for d in by_hand]
    got = bias(enc, [q], ks)  # [H, 1, len(ks)]
    assert got.shape == (H, 1, len(ks)) and got.dtype == torch.float32
    expected = torch.tensor([[float(bucket * H + h) for bucket in by_hand.values()] for h in range(H)])
    torch.testing.assert_close(got[:, 0], expected, atol=0, rtol=0)
    # Relative only, and one table for every layer (T5 shares it).
    torch.testing.assert_close(bias(enc, [q - 550], [k - 550 for k in ks]), got, atol=0, rtol=0)
    torch.testing.assert_close(bias(enc, [q], ks, layer=1), got, atol=0, rtol=0)


# --- FIRE -----------------------------------------------------------------------------------------


def test_fire_normalised_distance_is_psi_of_the_distance_over_psi_of_max_L_and_the_query_position():
    enc = encoding("fire", max_seq_len=32)  # L starts at max_seq_len / 4 = 8
    layer = enc.per_layer[0]
    assert layer.c.item() == pytest.approx(0.1) and layer.threshold.item() == 8.0
    with torch.no_grad():
        layer.c.fill_(-0.3)  # used as |c|
        layer.L_scale.fill_(1.25)  # L = 1.25 * 8 = 10
    psi = lambda x: math.log(0.3 * x + 1)  # noqa: E731
    # 0-based absolute positions; i is the query's. Below L the normaliser is psi(L), above it psi(i).
    qs, ks = [0, 3, 10, 11, 57], [0, 1, 3, 10, 30, 57]
    got = layer.normalized_distance(*grid(qs, ks))  # [Tq, Tk]
    for a, i in enumerate(qs):
        for b, j in enumerate(ks):
            if j <= i:
                expected = psi(i - j) / (psi(max(10, i)) + 1e-6)
                assert got[a, b].item() == pytest.approx(expected, rel=1e-5, abs=1e-7), (i, j)
    assert got[4, 0].item() == pytest.approx(1.0, rel=1e-5)  # i - j = i past L: the end of [0, 1]
    # Far past the training length the input stays in [0, 1].
    far = layer.normalized_distance(*grid([10_000, 50_000], [0, 9_999, 49_999]))
    assert 0 <= far.min() and far.max() <= 1


def set_fire_mlp(layer: FIRELayer, w1, b1, w2, b2):
    with torch.no_grad():
        for p, v in ((layer.w1, w1), (layer.b1, b1), (layer.w2, w2), (layer.b2, b2)):
            p.copy_(torch.tensor(v).view_as(p))


def test_fire_mlp_equals_its_units_written_out():
    layer = FIRELayer(n_head=2, width=3, init_L=8.0)
    w1, b1 = [1.0, -2.0, 0.5], [-0.25, 1.0, 0.0]
    w2, b2 = [[1.0, 2.0, -1.0], [0.5, -1.0, 3.0]], [0.1, -0.2]
    set_fire_mlp(layer, w1, b1, w2, b2)
    xs = [0.0, 0.1, 0.25, 0.4, 0.5, 0.75, 1.0]

    def by_hand(x, h):
        return b2[h] + sum(w2[h][k] * max(0.0, w1[k] * x + b1[k]) for k in range(3))

    x = torch.tensor(xs).view(1, -1)
    expected = torch.tensor([[by_hand(v, h) for v in xs] for h in range(2)]).view(2, 1, -1)
    torch.testing.assert_close(layer.mlp(x), expected, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(layer(x), expected, atol=1e-6, rtol=1e-6)  # the piecewise evaluation


def test_fire_piecewise_evaluation_equals_the_mlp_in_value_and_gradient():
    torch.manual_seed(1)
    layer = FIRELayer(n_head=H, width=16, init_L=8.0)
    with torch.no_grad():  # a constant unit (w1 = 0) and two units switching at the same point
        layer.w1[0] = 0.0
        layer.w1[2], layer.b1[2], layer.w1[3], layer.b1[3] = 1.0, -0.5, -2.0, 1.0
    x = torch.rand(9, 13, requires_grad=True)
    grad_out = torch.randn(H, 9, 13)
    results = []
    for evaluate in (layer.mlp, layer):
        layer.zero_grad()
        x.grad = None
        out = evaluate(x)
        out.backward(grad_out)
        results.append([out, x.grad, *(p.grad for p in (layer.w1, layer.b1, layer.w2, layer.b2))])
    for reference, piecewise in zip(*results, strict=True):
        torch.testing.assert_close(piecewise, reference, atol=1e-5, rtol=1e-5)


def test_fire_bias_is_the_mlp_of_the_normalised_distance_and_the_model_keeps_its_init():
    model = tiny_model("fire")
    enc = model.pos
    qs, ks = list(range(20, 26)), list(range(26))
    layer = enc.per_layer[1]
    expected = layer.mlp(layer.normalized_distance(*grid(qs, ks)))
    torch.testing.assert_close(bias(enc, qs, ks, layer=1), expected, atol=1e-5, rtol=1e-5)
    # nn.Linear's default init, not re-initialised at N(0, init_std) by the model.
    assert layer.w1.abs().max() > 0.5 and layer.w1.abs().max() <= 1.0
    assert layer.w2.abs().max() <= 1 / math.sqrt(32)


# --- What every one of them needs in a model -----------------------------------------------------


def randomize(enc, slot):
    torch.manual_seed(10 + slot)
    with torch.no_grad():
        for name, p in enc.named_parameters():
            if name.split(".")[1] == str(slot):
                p.copy_(torch.rand_like(p) + 0.5)


@pytest.mark.parametrize("name", PER_LAYER)
def test_per_layer_parameters_act_in_their_own_layer(name):
    enc = encoding(name, n_layer=4, pos=[name, "nope"])  # used by layers 0 and 2: slots 0 and 1
    enc = enc.for_layer(2)
    assert enc.layers == (0, 2) and enc.layer_slot(2) == 1
    randomize(enc, 0)
    randomize(enc, 1)
    qs, ks = [5, 9], list(range(10))
    first, third = bias(enc, qs, ks, layer=0), bias(enc, qs, ks, layer=2)
    assert (first - third).abs().max() > 1e-3
    randomize(enc, 0)  # the same values in slot 0 only change layer 0
    torch.testing.assert_close(bias(enc, qs, ks, layer=2), third, atol=0, rtol=0)
    with pytest.raises(ValueError):  # a layer that does not use the encoding has no slot
        enc.layer_slot(1)


@pytest.mark.parametrize("field,value,message", [
    ("t5_num_buckets", 0, r"model\.t5_num_buckets=0 is invalid: must be an integer >= 2"),
    ("t5_num_buckets", 1, r"model\.t5_num_buckets=1 is invalid"),
    ("t5_num_buckets", True, r"model\.t5_num_buckets=True is invalid"),
    ("t5_num_buckets", 8.0, r"model\.t5_num_buckets=8\.0 is invalid"),
    ("t5_max_distance", 16,
     r"model\.t5_max_distance=16 is invalid: must be an integer > t5_num_buckets // 2 = 16"),
    ("t5_max_distance", "128", r"model\.t5_max_distance='128' is invalid"),
    ("fire_mlp_width", 0, r"model\.fire_mlp_width=0 is invalid: must be a positive integer"),
])
def test_config_errors_are_one_line_and_name_the_field(field, value, message):
    pos = "fire" if field.startswith("fire") else "t5"
    with pytest.raises(ValueError, match=message) as error:
        ModelConfig(pos=pos, **{field: value})
    assert "\n" not in str(error.value)
    # Elsewhere the field must still be a positive integer; the encoding's own rule applies only where used.
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        ModelConfig(pos="rope", **{field: value})
    else:
        with pytest.raises(ValueError, match=rf"^model\.{field}=.* is invalid: must be a positive integer$"):
            ModelConfig(pos="rope", **{field: value})
    ModelConfig(pos=["rope", pos], t5_num_buckets=2, t5_max_distance=2)  # the smallest valid T5


@pytest.mark.parametrize("name", NAMES)
def test_gradient_reaches_every_parameter_and_the_state_dict_round_trips(name):
    model = tiny_model(name, init_std=0.1)
    idx = torch.randint(0, 32, (2, 33), generator=torch.Generator().manual_seed(0))
    model.loss(idx[:, :-1], idx[:, 1:]).backward()
    for pname, p in model.pos.named_parameters():
        assert p.grad is not None and p.grad.isfinite().all() and p.grad.abs().max() > 0, pname
    # Bias tables, gains and scalars are not decayed; FIRE's two weight matrices are.
    decayed = {id(p) for p in param_groups(model, 0.1)[0]["params"]}
    weights = {f"per_layer.{slot}.{w}" for slot in (0, 1) for w in ("w1", "w2")} if name == "fire" else set()
    assert {n for n, p in model.pos.named_parameters() if id(p) in decayed} == weights
    # Buffers are derived from the config, so a fresh model loads the weights and agrees.
    copy = tiny_model(name, init_std=0.1)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(copy(idx), model(idx), atol=0, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_bias_is_float32_and_finite_far_past_the_training_length(name):
    enc = encoding(name).to(torch.bfloat16)
    got = bias(enc, [0, 31, 5_000, 100_000], [0, 17, 4_000, 99_999])
    assert got.dtype == torch.float32 and got.shape == (H, 4, 4) and got.isfinite().all()


@pytest.mark.parametrize("name", NAMES)
def test_a_tiny_model_learns_a_repeated_random_sequence(name):
    model = tiny_model(name)
    period = torch.randint(0, 32, (8,), generator=torch.Generator().manual_seed(2))
    idx = period.repeat(4)[None]  # [1, 32]: 8 random tokens, 4 times
    before = [p.detach().clone() for p in model.pos.parameters()]
    losses = fit(model, idx)
    assert losses[-1] < 0.5 * losses[0], losses
    assert all((p - b).abs().max() > 0 for p, b in zip(model.pos.parameters(), before, strict=True))
