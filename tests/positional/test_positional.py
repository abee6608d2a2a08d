"""Positional encodings against their papers' formulas."""

import dataclasses
import math

import pytest
import torch
from torch._dynamo.utils import counters

from nanoattn import GPT, ModelConfig, load_checkpoint, preset
from nanoattn.checkpoint import save_checkpoint
from nanoattn.config.options import RECIPES, encoding_options
from nanoattn.positional import REGISTRY, alibi_slopes, build_positional, sinusoidal_table
from nanoattn.positional.base import PositionalEncoding
from nanoattn.train.step import LossModule


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_an_encodings_flags_say_where_it_acts(name):
    """The rules read the flags, so a flag must match the method it announces: ``adds_bias`` with its
    own ``bias``, ``acts_on_embeddings`` with its own ``embed`` (a user's encoding included)."""
    encoding = REGISTRY[name]
    assert issubclass(encoding, PositionalEncoding) and name in encoding_options()
    assert encoding.adds_bias == (encoding.bias is not PositionalEncoding.bias), name
    assert encoding.acts_on_embeddings == (encoding.embed is not PositionalEncoding.embed), name


@pytest.mark.parametrize("pos,i", [(0, 0), (1, 0), (7, 3), (100, 10), (4000, 31), (12345, 1)])
def test_sinusoidal_equals_the_seed_formula(pos, i):
    d = 64
    table = sinusoidal_table(torch.tensor([pos]), d)[0]
    angle = pos / 10000 ** (2 * i / d)
    assert table[2 * i].item() == pytest.approx(math.sin(angle), abs=2e-4)
    assert table[2 * i + 1].item() == pytest.approx(math.cos(angle), abs=2e-4)


def test_sinusoidal_is_defined_far_past_the_training_length():
    model = GPT(ModelConfig(vocab_size=20, d_model=16, n_layer=1, n_head=2, max_seq_len=8, pos="sinusoidal"))
    assert model(torch.zeros(1, 64, dtype=torch.long)).isfinite().all()


def test_learned_past_its_table_is_a_clear_error():
    model = GPT(ModelConfig(vocab_size=20, d_model=16, n_layer=1, n_head=2, max_seq_len=8, pos="learned"))
    model(torch.zeros(1, 8, dtype=torch.long))
    with pytest.raises(ValueError, match=r"length 9 is past the learned position table.*max_seq_len=8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def rotated_scores(rope, q, k, m, n):
    qm = rope.rotate(q, torch.tensor([m]), m + 1)
    kn = rope.rotate(k, torch.tensor([n]), n + 1)
    return (qm * kn).sum(-1)


@pytest.mark.parametrize("offset", [1, 17, 1000, 5000])
def test_rope_scores_depend_only_on_relative_position(offset):
    rope = build_positional(ModelConfig(d_model=64, n_head=2, pos="rope"))
    q, k = torch.randn(1, 1, 1, 32), torch.randn(1, 1, 1, 32)
    for m, n in [(5, 2), (10, 10), (3, 0), (40, 1)]:
        base = rotated_scores(rope, q, k, m, n)
        shifted = rotated_scores(rope, q, k, m + offset, n + offset)
        # float32 phases (as in transformers) carry ~pos * 6e-8 rad of error: ~3e-4 at 5000.
        torch.testing.assert_close(shifted, base, atol=2e-3, rtol=1e-3)
    assert not torch.allclose(rotated_scores(rope, q, k, 5, 2), rotated_scores(rope, q, k, 5, 3))


def test_rope_rotation_is_half_split_with_llama_frequencies():
    rope = build_positional(ModelConfig(d_model=8, n_head=1, pos="rope", rope_theta=10000.0))
    x = torch.randn(1, 1, 1, 8)
    m = 3
    out = rope.rotate(x, torch.tensor([m]), m + 1)[0, 0, 0]
    for i in range(4):
        angle = m / 10000 ** (2 * i / 8)
        a, b = x[0, 0, 0, i], x[0, 0, 0, i + 4]
        cos, sin = math.cos(angle), math.sin(angle)
        assert out[i].item() == pytest.approx((a * cos - b * sin).item(), abs=1e-5)
        assert out[i + 4].item() == pytest.approx((b * cos + a * sin).item(), abs=1e-5)


def test_rope_phase_is_float32_under_bf16_autocast():
    rope = build_positional(ModelConfig(d_model=64, n_head=1, pos="rope"))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cos, _ = rope.cos_sin(5000, torch.device("cpu"))
    assert cos.dtype == torch.float32
    assert cos[4999, 0].item() == pytest.approx(math.cos(4999.0), abs=1e-3)


def test_alibi_slopes_for_eight_heads_are_powers_of_one_half():
    assert alibi_slopes(8) == [2.0**-k for k in range(1, 9)]


def test_alibi_slopes_for_non_powers_of_two_follow_the_paper():
    assert alibi_slopes(6) == pytest.approx([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8])
    expected_12 = [2.0**-k for k in range(1, 9)] + [2.0 ** -(k + 0.5) for k in range(0, 4)]
    assert alibi_slopes(12) == pytest.approx(expected_12)


def test_alibi_bias_is_minus_slope_times_distance_not_scaled():
    alibi = build_positional(ModelConfig(d_model=64, n_head=4, pos="alibi"))
    bias = alibi.bias(None, None, torch.arange(5), torch.arange(5), 0)
    slopes = alibi_slopes(4)
    assert bias.shape == (4, 5, 5)
    assert bias[1, 4, 0].item() == pytest.approx(-slopes[1] * 4)
    assert bias[3, 2, 2].item() == 0.0


def test_sinusoidal_has_no_parameter_of_its_own():
    """Vaswani et al.'s fixed table; the block input it makes against the paper's formula is a
    reference check (nanoattn/references)."""
    fields = dict(vocab_size=50, d_model=16, n_head=2, n_layer=1)
    model = GPT(ModelConfig(**fields, pos="sinusoidal"))
    assert list(model.pos.parameters()) == [] and list(model.pos.buffers()) == []
    assert model.num_params() == GPT(ModelConfig(**fields, pos="nope")).num_params()


def test_sinusoidal_scaled_adds_the_table_times_one_learned_amplitude():
    model = GPT(ModelConfig(vocab_size=50, d_model=16, n_head=2, n_layer=1, pos="sinusoidal_scaled"))
    scale = model.pos.scale
    assert scale.requires_grad and scale.shape == (1,)
    with torch.no_grad():
        scale.fill_(0.3)
    x, positions = torch.randn(2, 5, 16), torch.arange(3, 8)
    torch.testing.assert_close(model.pos.embed(x, positions), x + 0.3 * sinusoidal_table(positions, 16))


def test_sinusoidal_scaled_starts_as_nope_and_its_amplitude_learns_from_zero():
    model = GPT(ModelConfig(vocab_size=50, d_model=16, n_head=2, n_layer=1, pos="sinusoidal_scaled"))
    assert torch.equal(model.pos.scale, torch.zeros(1))  # AMPLITUDE_INIT, after the model's own init
    x = torch.randn(2, 5, 16)
    assert torch.equal(model.pos.embed(x, torch.arange(5)), x)  # no position signal yet
    model.loss(torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 6))).backward()
    assert model.pos.scale.grad.abs().item() > 0  # so the first update moves it off zero


def test_a_trained_sinusoidal_scaled_amplitude_survives_a_checkpoint(tmp_path):
    model = GPT(ModelConfig(vocab_size=50, d_model=16, n_head=2, n_layer=1, pos="sinusoidal_scaled")).eval()
    with torch.no_grad():
        model.pos.scale.fill_(0.25)  # the loaded model starts at 0: the file must win
    save_checkpoint(tmp_path, "000001", model, train_seq_len=8, step=1)
    loaded = load_checkpoint(tmp_path).model
    assert loaded.pos.scale.item() == 0.25
    idx = torch.randint(0, 50, (1, 12))
    torch.testing.assert_close(loaded(idx), model(idx))


def test_the_learned_table_starts_at_zero_and_learns_per_position():
    model = GPT(ModelConfig(vocab_size=50, d_model=16, n_head=2, n_layer=1, pos="learned", max_seq_len=8))
    assert torch.equal(model.pos.table.weight, torch.zeros(8, 16))
    model.loss(torch.randint(0, 50, (2, 6)), torch.randint(0, 50, (2, 6))).backward()
    grad = model.pos.table.weight.grad
    assert (grad[:6].abs().sum(-1) > 0).all() and (grad[6:] == 0).all()  # positions 0..5 were used


@pytest.mark.parametrize("pos", sorted(encoding_options()))
def test_a_compiled_training_step_compiles_once(pos):
    """The second step reuses the first one's graphs: nothing an encoding keeps between calls changes
    while tracing (RoPE's static tables are built with the model, the abacus check is not traced), so
    the whole model compiles once per run.
    Dynamo alone (backend="eager") decides that: Inductor would only compile the same graphs."""
    fields = encoding_options()[pos]
    layers = len(fields["pos"]) if isinstance(fields["pos"], list) else 1  # iRoPE's layout has four
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=layers, n_head=4, n_kv_head=2, d_ff=64,
                      max_seq_len=32, abacus_digits=list(range(10)), **fields)
    net = torch.compile(LossModule(GPT(cfg).train()), backend="eager")
    idx = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    counters.clear()
    graphs = []
    for _ in range(2):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(idx, idx).backward()
        graphs.append(counters["stats"]["unique_graphs"])
    assert graphs[0] > 0 and graphs[1] == graphs[0]


def test_the_default_models_compiled_step_holds_no_autocast_region():
    """A region that enters autocast inside the compiled graph keeps AOTAutograd from caching the graph, so
    every later run would trace its backward again: the default run's forward has none (RoPE's tables
    are elementwise float32, which autocast leaves alone)."""
    cfg = preset("llama-tiny", vocab_size=64, d_model=32, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32)
    graphs = []

    def keep(graph, inputs):
        graphs.append(graph)
        return graph.forward

    net = torch.compile(LossModule(GPT(dataclasses.replace(cfg, **RECIPES["default"]["model"])).train()),
                        backend=keep)
    idx = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        net(idx, idx)
    targets = {str(node.target) for graph in graphs for node in graph.graph.nodes}
    assert graphs and not [t for t in targets if "autocast" in t]


@pytest.mark.parametrize("rope_scaling, builds_tables",
                         [(None, False), ({"type": "dynamic", "factor": 2.0}, True)])
def test_a_compiled_rope_model_reads_its_static_tables_and_builds_only_length_dependent_ones(
        rope_scaling, builds_tables):
    """Static cos/sin tables are graph inputs, built once with the model: built in the graph, Inductor
    fuses them into the rotation and computes cos and sin again for every head and sequence. Dynamic
    NTK's depend on the length, so its graph builds them."""
    cfg = preset("llama-tiny", vocab_size=64, d_model=32, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=32,
                 rope_scaling=rope_scaling)
    graphs = []

    def keep(graph, inputs):
        graphs.append(graph)
        return graph.forward

    model = GPT(cfg).train()
    net = torch.compile(LossModule(model), backend=keep)
    idx = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    torch._dynamo.reset()
    loss = net(idx, idx)
    targets = {str(node.target) for graph in graphs for node in graph.graph.nodes}
    assert any("cos" in t for t in targets) == builds_tables, sorted(targets)
    torch.testing.assert_close(loss, LossModule(model)(idx, idx), rtol=0, atol=0)
