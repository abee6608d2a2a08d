"""What every registered mechanism (``nanoattn.mechanisms.REGISTRY``) owes the rest of the package,
read from the registry so that a new one is held to it with no line here: its fields are config
fields whose defaults are the plain model, a bad value is a one-line error, it is a row of the
attention lab, the bare reference and the transformers export refuse it in one line, its
capabilities are the rules (given positions, differential attention, SDPA), and its hooks run in
registry order. Each mechanism's own equations are in its test file; cached decoding, chunked against
explicit scores and head analysis run over the lab's rows (tests/variants.py)."""

import dataclasses
import math

import pytest
import torch
from test_generate import LAYOUTS, check_cached_decoding, tiny

from nanoattn import GPT, ModelConfig
from nanoattn.bench.bare import BareGPT
from nanoattn.config.options import ATTENTION_VARIANTS
from nanoattn.hf.formats import FAMILIES, family_for
from nanoattn.mechanisms import REGISTRY, used_mechanisms
from nanoattn.model import Attention
from nanoattn.positional import build_positional
from nanoattn.validation import declared_defaults

BASE = dict(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)


def lab_row(name: str) -> dict:
    """The attention lab's smallest row that switches mechanism ``name`` on (FoX Pro's for its output
    norm, which has no row alone)."""
    rows = [row for row in ATTENTION_VARIANTS.values() if set(REGISTRY[name].fields) & row.keys()]
    assert rows, f"mechanism {name!r} has no row in ATTENTION_VARIANTS, so no lab prices it"
    return min(rows, key=len)


def on(name: str, **fields) -> ModelConfig:
    """The base model with mechanism ``name`` alone switched on, at its lab row's values."""
    row = lab_row(name)
    return ModelConfig(**{**BASE, **{field: row[field] for field in REGISTRY[name].fields if field in row},
                          **fields})


@pytest.mark.parametrize("name", REGISTRY)
def test_its_fields_are_config_fields_off_by_default(name):
    mechanism = REGISTRY[name]
    defaults = declared_defaults(ModelConfig)
    assert mechanism.fields and set(mechanism.fields) <= defaults.keys()
    assert not mechanism.used(ModelConfig(**BASE)) and mechanism.used(on(name))
    assert list(used_mechanisms(on(name))) == [name]


def test_each_holds_its_parameters_under_an_attribute_of_its_own():
    attributes = [mechanism.attribute for mechanism in REGISTRY.values()]
    assert all(attributes) and len(set(attributes)) == len(attributes)
    assert not set(attributes) & set(dict(Attention(ModelConfig(**BASE)).named_children()))


@pytest.mark.parametrize("name", REGISTRY)
def test_a_bad_value_is_a_one_line_error_naming_the_field(name):
    for field in REGISTRY[name].fields:
        with pytest.raises(ValueError, match=rf"^model\.{field}='maybe' is invalid: [^\n]+$"):
            ModelConfig(**{**BASE, field: "maybe"})


@pytest.mark.parametrize("name", REGISTRY)
def test_the_bare_reference_and_a_plain_export_refuse_it_in_one_line(name):
    cfg = on(name)
    with pytest.raises(ValueError, match=r"^model\.\w+=[^\n]+ is outside the bare reference [^\n]+$") as bare:
        BareGPT(cfg)
    assert str(bare.value).removeprefix("model.").split("=")[0] in REGISTRY[name].fields
    plain = declared_defaults(ModelConfig)
    mapping = [family for family in FAMILIES for field in REGISTRY[name].fields
               if family.needs.get(field, plain[field]) == getattr(cfg, field) != plain[field]]
    if mapping:  # a transformers class computes it (Qwen 3's QK-norm, Qwen3-Next's gate): that family
        assert family_for(dataclasses.replace(cfg, **mapping[0].needs)) is mapping[0]
    else:
        with pytest.raises(ValueError, match=r"^[^\n]+$"):
            family_for(cfg)


@pytest.mark.parametrize("layout", ["mha", "mqa"])
@pytest.mark.parametrize("name", REGISTRY)
def test_cached_decoding_is_exact_with_each_kv_layout(name, layout):
    """Past the training length with one K/V head per query head and with one for all (GQA: every lab
    row in tests/test_generate.py)."""
    row = lab_row(name)
    fields = {field: row[field] for field in REGISTRY[name].fields}
    check_cached_decoding(tiny("rope", LAYOUTS[layout], **fields))


@pytest.mark.parametrize("name", [name for name, m in REGISTRY.items() if m.given_positions_refusal])
def test_given_positions_are_refused_as_the_mechanism_says(name):
    model = GPT(on(name))
    with pytest.raises(ValueError, match=rf"^positions=\[1, 4\] is invalid for this model: model\."
                                         rf"{REGISTRY[name].fields[0]}=[^\n]+$"):
        model(torch.zeros(1, 4, dtype=torch.long), positions=torch.arange(4)[None])  # [B, T] = [1, 4]


@pytest.mark.parametrize("name", [name for name, m in REGISTRY.items() if m.paired_heads_refusal])
def test_differential_attention_refuses_it_as_the_mechanism_says(name):
    with pytest.raises(ValueError, match=rf"^model\.{REGISTRY[name].fields[0]}=[^\n]+ is invalid: cannot be "
                                         r"combined with diff_attn=True: [^\n]+$"):
        on(name, diff_attn=True)


@pytest.mark.parametrize("name", REGISTRY)
def test_sdpa_serves_it_exactly_when_it_says_so(name, monkeypatch):
    """A mechanism that leaves the scores and weights alone keeps SDPA's causal kernel (memory linear
    in T); one that changes them takes the explicit scores."""
    kernels = []
    real = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: kernels.append(k.get("is_causal")) or real(*a, **k))
    attn = Attention(on(name))
    q, k, v = torch.randn(1, 4, 12, 8), torch.randn(1, 2, 12, 8), torch.randn(1, 2, 12, 8)
    positions = torch.arange(12)
    attn.attend_heads(q, k, v, positions, positions, build_positional(on(name)), 0)
    assert (kernels == [True]) == REGISTRY[name].sdpa_computes


def test_the_layer_calls_the_heads_hooks_in_registry_order():
    """Exclusion, then the norm, then the gate: the layer's output is plain attention's heads through the
    three hooks in that order, then W_O (NoPE, so the heads are the projections as they are)."""
    cfg = ModelConfig(**BASE, pos="nope", xsa=True, attn_output_norm=True, attn_gate="headwise")
    attn, pe = Attention(cfg).eval(), build_positional(cfg)
    assert [type(m).__name__ for m in attn.mechanisms] == [
        m.__name__ for name, m in REGISTRY.items() if name in ("xsa", "attn_output_norm", "attn_gate")]
    with torch.no_grad():
        x, positions = torch.randn(2, 6, 32), torch.arange(6)
        q, k, v = attn.qkv(x).view(2, 6, 8, 8).transpose(1, 2).split([4, 2, 2], dim=1)
        y = attn.attend_heads(q, k, v, positions, positions, pe, 0)[0]
        y = attn.output_gate.heads(x, attn.output_norm.heads(x, attn.exclude_self.heads(x, y, v), v), v)
        by_hand = attn.proj(y.transpose(1, 2).reshape(2, 6, 32))
        torch.testing.assert_close(attn(x, pe, positions, 6)[0], by_hand)


@pytest.mark.parametrize(("mode", "width"), [("headwise", 4), ("elementwise", 32)])
def test_the_gate_has_one_score_per_head_or_per_channel(mode, width):
    attn = Attention(ModelConfig(d_model=32, n_head=4, n_kv_head=2, attn_gate=mode))
    assert attn.output_gate.proj.weight.shape == (width, 32)


def test_ssmax_starts_as_the_plain_softmax_at_the_training_length():
    """s = 1 / log(max_seq_len): s log n = 1 when a query sees max_seq_len keys."""
    attn = Attention(ModelConfig(d_model=32, n_head=4, ssmax=True, max_seq_len=16))
    assert torch.allclose(attn.ssmax.s, torch.full((4,), 1 / math.log(16)))


def test_a_plain_model_builds_no_mechanism():
    attn = Attention(ModelConfig(**BASE))
    assert attn.mechanisms == [] and not attn.explicit
