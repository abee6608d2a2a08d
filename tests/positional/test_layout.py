"""Per-layer layouts: one config field cycled over the layers, each layer gets its own encoding.

References: hand-cycled lists, uniform models (a layout naming one encoding computes the same
function), Llama 4's query temperature formula evaluated by hand, a checkpoint round trip.
"""

from __future__ import annotations

import math

import pytest
import torch

from nanoattn import GPT, ModelConfig, load_checkpoint
from nanoattn.checkpoint import save_checkpoint
from nanoattn.config.per_layer import per_layer
from nanoattn.positional import LayerLayout
from nanoattn.positional.nope import NoPositionalEncoding, query_temperature
from nanoattn.positional.rope import RotaryPositionalEncoding


def small(**fields) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=50, d_model=32, n_layer=4, n_head=4, n_kv_head=2, d_ff=64,
                           max_seq_len=32, init_std=0.1, **fields)).eval()


def test_per_layer_cycles_a_list_and_repeats_a_single_value():
    assert per_layer(["a", "b", "c"], 7) == ("a", "b", "c", "a", "b", "c", "a")
    assert per_layer("rope", 3) == ("rope", "rope", "rope")
    assert per_layer(None, 2) == (None, None)
    assert ModelConfig(n_layer=4, pos=["rope", "rope", "rope", "nope"]).layer_pos == ("rope",) * 3 + ("nope",)


def test_each_layer_gets_its_encoding_and_each_name_is_built_once():
    model = small(pos=["rope", "nope"])
    assert isinstance(model.pos, LayerLayout)
    kinds = [type(model.pos.for_layer(i)) for i in range(4)]
    assert kinds == [RotaryPositionalEncoding, NoPositionalEncoding] * 2
    assert model.pos.for_layer(0) is model.pos.for_layer(2)
    assert model.pos.for_layer(0).layers == (0, 2) and model.pos.for_layer(1).layers == (1, 3)
    assert model.pos.for_layer(3).layer_slot(3) == 1


@pytest.mark.parametrize("name", ["rope", "alibi", "nope"])
def test_a_layout_of_one_encoding_is_the_uniform_model(name):
    idx = torch.randint(0, 50, (2, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        uniform, layout = small(pos=name)(idx), small(pos=[name, name])(idx)
    torch.testing.assert_close(layout, uniform, atol=0, rtol=0)


def test_an_interleaved_layout_differs_from_both_of_its_encodings():
    idx = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        mixed = small(pos=["rope", "nope"])(idx)
        for name in ("rope", "nope"):
            assert (mixed - small(pos=name)(idx)).abs().max() > 1e-3


@pytest.mark.parametrize(("pos", "message"), [
    (["rope", "learned"], "'learned' adds positions to the embeddings"),
    (["sinusoidal"], "'sinusoidal' adds positions to the embeddings"),
    (["rope", "bogus"], "model.pos='bogus' is invalid: allowed:"),
    ([], "must be an encoding name or a list of 1 to n_layer=4"),
    (["rope"] * 5, "must be an encoding name or a list of 1 to n_layer=4"),
    (7, "must be an encoding name or a list"),
])
def test_bad_layouts_are_one_line_errors(pos, message):
    with pytest.raises(ValueError, match=message) as error:
        ModelConfig(n_layer=4, pos=pos)
    assert "\n" not in str(error.value)


def test_rope_scaling_needs_a_rotary_layer():
    with pytest.raises(ValueError, match="only applies to rotary encodings"):
        ModelConfig(n_layer=2, pos=["nope", "alibi"], rope_scaling={"type": "linear", "factor": 2})
    cfg = ModelConfig(n_layer=2, pos=["rope", "nope"], rope_scaling={"type": "linear", "factor": 2})
    assert cfg.rope_scaling["factor"] == 2.0


def test_query_temperature_is_llama4s_formula():
    positions = torch.tensor([0, 6, 7, 14, 15, 100])
    expected = [1.0 + 0.1 * math.log(math.floor((p + 1) / 8) + 1) for p in positions.tolist()]
    torch.testing.assert_close(query_temperature(positions, 8, 0.1), torch.tensor(expected))
    assert query_temperature(positions, 8, 0.1)[:2].tolist() == [1.0, 1.0]  # below floor_scale - 1


def test_the_temperature_scales_only_the_queries_of_nope_layers():
    model = small(pos=["rope", "nope"], temperature_floor_scale=4, temperature_attn_scale=0.5)
    q, positions = torch.ones(1, 4, 10, 8), torch.arange(10)
    rope, nope = model.pos.for_layer(0), model.pos.for_layer(1)
    assert torch.equal(rope.scale_queries(q, positions), q)
    scaled = nope.scale_queries(q, positions)
    torch.testing.assert_close(scaled[0, 0, :, 0], query_temperature(positions, 4, 0.5))
    assert torch.equal(nope.scale_keys(q, positions), q)
    off = small(pos=["rope", "nope"])  # temperature_floor_scale=None: NoPE is the identity
    assert torch.equal(off.pos.for_layer(1).scale_queries(q, positions), q)


def test_temperature_fields_are_validated():
    for fields, message in [(dict(temperature_floor_scale=0), "temperature_floor_scale=0"),
                            (dict(temperature_attn_scale=-1.0), "temperature_attn_scale=-1.0")]:
        with pytest.raises(ValueError, match=message):
            ModelConfig(**fields)


def test_a_layout_checkpoint_round_trips(tmp_path):
    model = small(pos=["rope", "rope", "rope", "nope"], temperature_floor_scale=8)
    path = save_checkpoint(tmp_path, "000001", model, train_seq_len=32, step=1, trainer_state={"step": 1})
    loaded = load_checkpoint(path).model
    assert loaded.cfg.pos == ["rope", "rope", "rope", "nope"] and loaded.cfg.temperature_floor_scale == 8
    idx = torch.randint(0, 50, (1, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(loaded(idx), model(idx), atol=0, rtol=0)
