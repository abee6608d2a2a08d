"""Export to / import from transformers' Llama 4 (RoPE/NoPE layouts), Phi-3 (partial RoPE, LongRoPE)
Qwen 3 (QK-norm before RoPE), Qwen3-Next (output gates) and Ministral (sliding windows).

References, as in test_hf.py: transformers' own models loaded from the exported folder (logits
past the original context, eager attention, greedy ``generate``), models that transformers
itself creates and saves, and the round trip. Every weight is perturbed first. And the
refusals: every positional encoding of the registry that no transformers class computes
(iterated at test time, so a new encoding is covered the day it is registered).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Llama4ForCausalLM,
    Llama4TextConfig,
    MinistralConfig,
    MinistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)
from variants import VARIANTS

from nanoattn import GPT, ModelConfig, generate
from nanoattn.hf import export_hf, import_hf
from nanoattn.positional import REGISTRY
from nanoattn.references.fixtures import (
    BASE,
    LONG,
    ORIGINAL,
    VOCAB,
    load_transformers,
    logits_diff,
    model,
    perturb_,
    tokens,
)

ATOL = 1e-5
# Llama 4's iRoPE with its query temperature acting from position 7 on (x2.2 at position 79).
IROPE = dict(BASE, pos=["rope", "rope", "rope", "nope"], temperature_floor_scale=8,
             temperature_attn_scale=0.5)
PAIRS = {1.0: 8, 0.5: 4, 0.25: 2}  # head_dim 16: rotated pairs per rope_fraction


def longrope(fraction: float = 1.0, **extra) -> dict:
    """A LongRoPE scaling with distinct, increasing factors per rotated pair (as searched ones are)."""
    pairs = PAIRS[fraction]
    return {"type": "longrope", "factor": 4.0, "short_factor": [1.0 + 0.1 * i for i in range(pairs)],
            "long_factor": [1.0 + 3.0 * i / (pairs - 1) for i in range(pairs)], **extra}


def assert_same_weights(a: GPT, b: GPT) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert torch.equal(sa[key], sb[key]), key


def config_json(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


# ----------------------------------------------------------------------------- Llama 4


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_llama4_export_logits_equal_transformers_with_the_temperature(tmp_path, n_kv_head):
    ours = model(**{**IROPE, "n_kv_head": n_kv_head, "tie_embeddings": n_kv_head != 2})
    path = export_hf(ours, tmp_path / "hf")
    theirs = load_transformers(path)
    assert isinstance(theirs, Llama4ForCausalLM)
    config = theirs.config
    assert config.no_rope_layers == [1, 1, 1, 0] and config.moe_layers == [] and not config.use_qk_norm
    assert config.layer_types == ["full_attention"] * 4 and config.attn_temperature_tuning
    assert logits_diff(ours, theirs) < ATOL
    # The temperature acts within the test length: without it transformers computes something else.
    assert logits_diff(ours, load_transformers(path, attn_temperature_tuning=False)) > 1e-2


@pytest.mark.parametrize("fields", [
    dict(BASE, pos="nope", temperature_floor_scale=4),
    dict(BASE, pos=["nope", "rope"]),
    dict(BASE, n_layer=5, pos=["rope", "nope"], temperature_floor_scale=16, temperature_attn_scale=0.1),
    dict(IROPE, n_kv_head=4, rope_theta=500000.0, temperature_attn_scale=0.0),
], ids=["all-nope", "nope-rope", "rope-nope-5-layers", "attn-scale-0"])
def test_llama4_layouts_equal_transformers(tmp_path, fields):
    ours = model(**fields)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert isinstance(theirs, Llama4ForCausalLM)
    assert theirs.config.no_rope_layers == [int(kind == "rope") for kind in ours.cfg.layer_pos]
    assert logits_diff(ours, theirs) < ATOL


@pytest.mark.parametrize("scaling", [
    {"type": "linear", "factor": 2.5},
    {"type": "ntk", "factor": 3.0},
    {"type": "dynamic", "factor": 2.0},
    {"type": "yarn", "factor": 4.0},
    {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
], ids=lambda scaling: scaling["type"])
def test_llama4_rope_scalings_equal_transformers(tmp_path, scaling):
    ours = model(**IROPE, rope_scaling=scaling)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert logits_diff(ours, theirs) < ATOL


def test_llama4_greedy_generation_equals_transformers_generate(tmp_path):
    ours = model(**IROPE)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"), attn_implementation="sdpa")
    idx, n = tokens(16), LONG - 16  # the temperature grows at every 8th position of the decoding
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)


@pytest.mark.parametrize("fields", [
    IROPE,
    dict(IROPE, tie_embeddings=False, dropout=0.1, norm_eps=1e-6, rope_theta=500.0, init_std=0.05,
         temperature_floor_scale=None, temperature_attn_scale=0.2),
    dict(IROPE, rope_scaling={"type": "yarn", "factor": 4.0}),
    dict(BASE, pos="nope", temperature_floor_scale=4),
    dict(BASE, pos=["nope", "rope"], n_kv_head=1),
], ids=["irope", "untied-no-temperature", "yarn", "all-nope", "nope-rope"])
def test_llama4_export_then_import_gives_identical_weights_and_config(tmp_path, fields):
    ours = model(**fields)
    back = import_hf(export_hf(ours, tmp_path / "hf"))
    assert back.cfg == ours.cfg
    assert_same_weights(back, ours)


def test_import_llama4_created_by_transformers(tmp_path):
    config = Llama4TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=32,
                              intermediate_size_mlp=96, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=1, head_dim=16, max_position_embeddings=4 * ORIGINAL,
                              no_rope_layers=[1, 0, 1, 1], moe_layers=[], use_qk_norm=False,
                              attention_chunk_size=None, floor_scale=8, attn_scale=0.5,
                              rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
                              bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    perturb_(Llama4ForCausalLM(config)).save_pretrained(tmp_path)
    theirs = load_transformers(tmp_path)
    ours = import_hf(tmp_path)
    assert ours.cfg.layer_pos == ("rope", "nope", "rope", "rope") and ours.cfg.n_kv_head == 1
    assert ours.cfg.pos == ["rope", "nope", "rope"]  # the shortest list that, cycled, gives the layers
    assert ours.cfg.temperature_floor_scale == 8 and ours.cfg.temperature_attn_scale == 0.5
    assert ours.cfg.rope_theta == 1000.0 and not ours.cfg.tie_embeddings
    assert logits_diff(ours, theirs) < ATOL


def test_uniform_rope_still_exports_as_llama(tmp_path):
    # A temperature on a model without NoPE layers acts nowhere: still plain Llama, bit for bit.
    ours = model(**BASE, temperature_floor_scale=8)
    path = export_hf(ours, tmp_path / "hf")
    assert config_json(path)["model_type"] == "llama"
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    assert logits_diff(ours, theirs) == 0.0


# ----------------------------------------------------------------------------- Phi-3


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("fraction", [0.5, 0.25])
def test_phi3_partial_rope_export_logits_equal_transformers(tmp_path, fraction, n_kv_head):
    ours = model(**{**BASE, "n_kv_head": n_kv_head}, rope_fraction=fraction, tie_embeddings=n_kv_head != 2)
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert isinstance(theirs, Phi3ForCausalLM)
    assert theirs.config.rope_parameters["partial_rotary_factor"] == fraction
    assert logits_diff(ours, theirs) < ATOL


def test_phi3_partial_rope_with_ntk_is_a_plain_base_change(tmp_path):
    ours = model(**BASE, rope_fraction=0.5, rope_scaling={"type": "ntk", "factor": 3.0})
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert theirs.config.rope_parameters["rope_type"] == "default"
    assert theirs.config.rope_parameters["rope_theta"] > ours.cfg.rope_theta
    assert logits_diff(ours, theirs) < ATOL


@pytest.mark.parametrize("length", [ORIGINAL, LONG], ids=["short-factors", "long-factors"])
@pytest.mark.parametrize("fields", [
    dict(rope_scaling=longrope()),
    dict(rope_fraction=0.5, rope_scaling=longrope(0.5)),
    dict(rope_scaling=longrope(attention_factor=1.3), n_kv_head=1),
    dict(max_seq_len=4 * ORIGINAL, rope_scaling=longrope(factor=None, original_max_seq_len=ORIGINAL)),
], ids=["whole-head", "partial", "attention-factor", "derived-factor"])
def test_phi3_longrope_export_logits_equal_transformers(tmp_path, fields, length):
    ours = model(**{**BASE, **fields})
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"))
    assert isinstance(theirs, Phi3ForCausalLM) and theirs.config.rope_parameters["rope_type"] == "longrope"
    assert logits_diff(ours, theirs, length) < ATOL


def test_phi3_longrope_greedy_generation_equals_transformers_generate(tmp_path):
    # The prompt is already past the original length, so both use the long factors at every step
    # (a decoding that crosses it is exact in nanoattn only: transformers keeps short-factor keys).
    ours = model(**BASE, rope_fraction=0.5, rope_scaling=longrope(0.5))
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"), attn_implementation="sdpa")
    idx, n = tokens(ORIGINAL + 8), LONG - ORIGINAL - 8
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)


@pytest.mark.parametrize("fields", [
    dict(BASE, rope_fraction=0.5),
    dict(BASE, rope_fraction=0.25, tie_embeddings=False, dropout=0.1, norm_eps=1e-6, rope_theta=500.0),
    dict(BASE, rope_scaling=longrope()),
    dict(BASE, rope_fraction=0.5, rope_scaling=longrope(0.5, attention_factor=1.3)),
], ids=["partial", "partial-untied", "longrope", "partial-longrope"])
def test_phi3_export_then_import_gives_identical_weights_and_config(tmp_path, fields):
    ours = model(**fields)
    back = import_hf(export_hf(ours, tmp_path / "hf"))
    assert back.cfg == ours.cfg
    assert_same_weights(back, ours)


def test_import_phi3_created_by_transformers(tmp_path):
    rope = {"rope_type": "longrope", "rope_theta": 1000.0, "partial_rotary_factor": 0.5, "factor": 4.0,
            "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [1.0, 2.0, 3.0, 4.0]}
    config = Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * ORIGINAL,
                        original_max_position_embeddings=ORIGINAL, rope_parameters=rope,
                        bos_token_id=0, eos_token_id=0, pad_token_id=None)
    torch.manual_seed(0)
    perturb_(Phi3ForCausalLM(config)).save_pretrained(tmp_path)
    theirs = load_transformers(tmp_path)
    ours = import_hf(tmp_path)
    assert ours.cfg.rope_fraction == 0.5 and ours.cfg.rope_scaling["type"] == "longrope"
    assert ours.cfg.rope_scaling["original_max_seq_len"] == ORIGINAL
    for length in (ORIGINAL, LONG):
        assert logits_diff(ours, theirs, length) < ATOL


# ----------------------------------------------------------------------------- Qwen 3

QWEN3 = dict(BASE, qk_norm="before_rope")


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_qwen3_export_of_qk_norm_logits_equal_transformers(tmp_path, n_kv_head):
    ours = model(**{**QWEN3, "n_kv_head": n_kv_head, "tie_embeddings": n_kv_head != 2})
    path = export_hf(ours, tmp_path / "hf")
    theirs = load_transformers(path)
    assert isinstance(theirs, Qwen3ForCausalLM) and theirs.config.layer_types == ["full_attention"] * 4
    assert logits_diff(ours, theirs) < ATOL
    # The norms' gains were perturbed and travel: with unit gains transformers computes something else.
    unit = load_transformers(path)
    for layer in unit.model.layers:
        torch.nn.init.ones_(layer.self_attn.q_norm.weight)
    assert logits_diff(ours, unit) > 1e-3


def test_qwen3_with_yarn_and_greedy_generation_equal_transformers(tmp_path):
    ours = model(**QWEN3, rope_scaling={"type": "yarn", "factor": 4.0})
    path = export_hf(ours, tmp_path / "hf")
    assert logits_diff(ours, load_transformers(path)) < ATOL
    theirs = load_transformers(path, attn_implementation="sdpa")
    idx, n = tokens(16), LONG - 16
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)


def test_qwen3_round_trip_and_a_model_transformers_created(tmp_path):
    ours = model(**QWEN3, tie_embeddings=False, norm_eps=1e-6)
    back = import_hf(export_hf(ours, tmp_path / "ours"))
    assert back.cfg == ours.cfg
    assert_same_weights(back, ours)
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                         max_position_embeddings=ORIGINAL, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    perturb_(Qwen3ForCausalLM(config)).save_pretrained(tmp_path / "theirs")
    imported = import_hf(tmp_path / "theirs")
    assert imported.cfg.qk_norm == "before_rope" and imported.cfg.n_kv_head == 2
    assert logits_diff(imported, load_transformers(tmp_path / "theirs")) < ATOL


# ----------------------------------------------------------------------------- Qwen3-Next

QWEN3_NEXT = dict(QWEN3, attn_gate="elementwise")


@pytest.mark.parametrize("fields", [dict(n_kv_head=4, tie_embeddings=True), dict(n_kv_head=2),
                                    dict(n_kv_head=1, rope_fraction=0.25)], ids=["mha", "gqa", "mqa-partial"])
def test_qwen3_next_export_of_the_output_gate_logits_equal_transformers(tmp_path, fields):
    ours = model(**{**QWEN3_NEXT, **fields})
    path = export_hf(ours, tmp_path / "hf")
    theirs = load_transformers(path)
    assert isinstance(theirs, Qwen3NextForCausalLM)
    assert theirs.config.layer_types == ["full_attention"] * 4 and theirs.config.num_experts == 0
    assert logits_diff(ours, theirs) < ATOL
    # The gate's rows travel inside q_proj: with them zeroed (every gate 0.5) transformers differs.
    ungated = load_transformers(path)
    with torch.no_grad():
        for layer in ungated.model.layers:
            layer.self_attn.q_proj.weight.view(4, 2, 16, 64)[:, 1] = 0
    assert logits_diff(ours, ungated) > 1e-3


def test_qwen3_next_with_yarn_and_greedy_generation_equal_transformers(tmp_path):
    ours = model(**QWEN3_NEXT, rope_scaling={"type": "yarn", "factor": 4.0})
    path = export_hf(ours, tmp_path / "hf")
    assert logits_diff(ours, load_transformers(path)) < ATOL
    theirs = load_transformers(path, attn_implementation="sdpa")
    idx, n = tokens(16), LONG - 16
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)


def test_qwen3_next_round_trip_and_a_model_transformers_created(tmp_path):
    ours = model(**QWEN3_NEXT, tie_embeddings=False, norm_eps=1e-6)
    back = import_hf(export_hf(ours, tmp_path / "ours"))
    assert back.cfg == ours.cfg
    assert_same_weights(back, ours)  # the gains' offset of 1 is exact for gains in [0.5, 2]
    config = Qwen3NextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=0,
                             layer_types=["full_attention"] * 2, max_position_embeddings=ORIGINAL,
                             bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    perturb_(Qwen3NextForCausalLM(config)).save_pretrained(tmp_path / "theirs")
    imported = import_hf(tmp_path / "theirs")
    assert imported.cfg.attn_gate == "elementwise" and imported.cfg.rope_fraction == 0.25  # its default
    assert logits_diff(imported, load_transformers(tmp_path / "theirs")) < ATOL


# ----------------------------------------------------------------------------- Ministral

WINDOW = 6  # far inside the 80-token test length


@pytest.mark.parametrize("n_kv_head", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("windows", [WINDOW, [WINDOW, None], [None, WINDOW, WINDOW, None]],
                         ids=["all-local", "alternating", "mixed"])
def test_ministral_export_of_sliding_windows_logits_equal_transformers(tmp_path, windows, n_kv_head):
    ours = model(**{**BASE, "n_kv_head": n_kv_head}, sliding_window=windows)
    path = export_hf(ours, tmp_path / "hf")
    theirs = load_transformers(path)
    assert isinstance(theirs, MinistralForCausalLM) and theirs.config.sliding_window == WINDOW
    assert theirs.config.layer_types == ["full_attention" if w is None else "sliding_attention"
                                         for w in ours.cfg.layer_window]
    assert logits_diff(ours, theirs) < ATOL
    back = import_hf(path)
    assert back.cfg.layer_window == ours.cfg.layer_window
    assert_same_weights(back, ours)


def test_ministral_greedy_generation_past_the_window_equals_transformers_generate(tmp_path):
    ours = model(**BASE, sliding_window=[WINDOW, None])
    theirs = load_transformers(export_hf(ours, tmp_path / "hf"), attn_implementation="sdpa")
    idx, n = tokens(16), LONG - 16  # the local layers' caches roll from the prompt on
    expected = theirs.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n, min_new_tokens=n,
                               do_sample=False)
    assert torch.equal(generate(ours, idx, n, temperature=0), expected)


def test_import_ministral_created_by_transformers(tmp_path):
    config = MinistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=5,
                             layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                             max_position_embeddings=ORIGINAL, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    perturb_(MinistralForCausalLM(config)).save_pretrained(tmp_path)
    ours = import_hf(tmp_path)
    assert ours.cfg.layer_window == (5, None, 5)
    assert logits_diff(ours, load_transformers(tmp_path)) < ATOL


# ----------------------------------------------------------------------------- p-RoPE


@pytest.mark.parametrize("fields", [
    dict(BASE, rope_p=0.5),
    dict(BASE, rope_p=0.75, rope_scaling={"type": "linear", "factor": 2.5}, n_kv_head=1),
    dict(BASE, rope_p=0.25, rope_scaling={"type": "ntk", "factor": 3.0}),
    dict(IROPE, rope_p=0.5),
], ids=["llama", "llama-linear", "llama-ntk", "llama4"])
def test_p_rope_exports_as_proportional_rope(tmp_path, fields):
    # transformers' "proportional" RoPE keeps the first int(p * head_dim // 2) frequencies and zeroes
    # the rest: p-RoPE. Its factor divides every frequency (our linear scaling); it logs that
    # "factor" is an unrecognized key, and uses it.
    ours = model(**fields)
    path = export_hf(ours, tmp_path / "hf")
    theirs = load_transformers(path)
    rope = theirs.config.rope_parameters
    assert rope["rope_type"] == "proportional" and rope["partial_rotary_factor"] == ours.cfg.rope_p
    assert logits_diff(ours, theirs) < ATOL
    back = import_hf(path)
    if ours.cfg.rope_scaling is None or ours.cfg.rope_scaling["type"] != "ntk":  # ntk: a plain base
        assert back.cfg == ours.cfg
    assert_same_weights(back, ours)


# ----------------------------------------------------------------------------- refusals


def refused(tmp_path: Path, fields: dict) -> str:
    with pytest.raises(ValueError) as error:
        export_hf(GPT(ModelConfig(**fields)), tmp_path / "hf")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "hf").exists()
    return str(error.value)


EXPORTED = {"rope", "nope", "learned"}  # the encodings some layout of which transformers computes


@pytest.mark.parametrize("name", sorted(set(REGISTRY) - EXPORTED))
def test_export_refuses_every_other_registered_encoding(tmp_path, name):
    message = refused(tmp_path, dict(BASE, pos=name))
    assert message.startswith(f"model.pos={name!r} has no transformers counterpart; export supports ")
    assert "pos='rope' (Llama)" in message and "'rope' and 'nope' layers (Llama 4)" in message


@pytest.mark.parametrize("name", sorted(name for name, encoding in REGISTRY.items()
                                        if name not in EXPORTED and not encoding.acts_on_embeddings))
def test_export_refuses_layouts_that_are_not_rope_and_nope(tmp_path, name):
    fields = dict(BASE, pos=["rope", name, "nope"])
    message = refused(tmp_path, fields)
    assert message.startswith(f"model.pos={fields['pos']!r} has no transformers counterpart; export supports")


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_attention_variant_exports_exactly_or_is_refused(tmp_path, variant):
    """Iterated at test time like the encodings above: a new variant cannot export as a model that
    silently computes something else."""
    ours = model(**{**BASE, **VARIANTS[variant]})
    try:
        path = export_hf(ours, tmp_path / "hf")
    except ValueError as error:
        assert "\n" not in str(error) and str(error).startswith("model.")
        return
    assert logits_diff(ours, load_transformers(path)) < ATOL


@pytest.mark.parametrize("fields, message", [
    (dict(BASE, rope_p=0.5, rope_scaling={"type": "yarn", "factor": 4.0}),
     "model.rope_p=0.5 with rope_scaling type 'yarn' has no transformers counterpart: p-RoPE exports as"),
    (dict(IROPE, rope_p=0.5, rope_scaling={"type": "dynamic", "factor": 2.0}),
     "model.rope_p=0.5 with rope_scaling type 'dynamic' has no transformers counterpart"),
    (dict(BASE, rope_p=0.5, rope_fraction=0.5), "model.rope_p=0.5 has no counterpart in transformers' Phi-3"),
    (dict(IROPE, rope_fraction=0.5), "model.rope_fraction=0.5 has no counterpart in transformers' Llama 4"),
    (dict(IROPE, rope_scaling=longrope()),
     "model.rope_scaling.type='longrope' has no counterpart in transformers' Llama 4"),
    (dict(IROPE, bias=True), "model.bias=True has no counterpart in transformers' Llama 4 format"),
    (dict(IROPE, norm="layernorm"), "model.norm='layernorm' has no counterpart in transformers' Llama 4"),
    (dict(BASE, rope_fraction=0.5, bias=True), "model.bias=True has no counterpart in transformers' Phi-3"),
    (dict(BASE, rope_fraction=0.5, mlp="gelu"), "model.mlp='gelu' has no counterpart in transformers' Phi-3"),
    (dict(BASE, rope_fraction=0.5, rope_scaling={"type": "yarn", "factor": 4.0}),
     "model.rope_scaling.type='yarn' has no counterpart in transformers' Phi-3 format .*only scalings are "
     "longrope and ntk"),
    (dict(BASE, qk_norm="after_rope"),
     "model.qk_norm='after_rope' has no counterpart in transformers' Qwen 3 format .*which needs "
     "qk_norm='before_rope'"),
    (dict(QWEN3, bias=True), "model.bias=True has no counterpart in transformers' Qwen 3 format"),
    (dict(BASE, attn_softcap=50.0), "model.attn_softcap=50.0 has no counterpart in transformers' Llama "),
    (dict(QWEN3, logit_softcap=30.0), "model.logit_softcap=30.0 has no counterpart in transformers' Qwen 3"),
    (dict(IROPE, qk_norm="before_rope"),
     "model.qk_norm='before_rope' has no counterpart in transformers' Llama 4"),
    (dict(BASE, rope_fraction=0.5, attn_softcap=50.0), "model.attn_softcap=50.0 has no counterpart in "
     "transformers' Phi-3"),
    (dict(BASE, pos="learned", norm="layernorm", mlp="gelu", bias=True, logit_softcap=30.0),
     "model.logit_softcap=30.0 has no counterpart in transformers' GPT-2"),
    (dict(BASE, sliding_window=[8, 16]),
     r"model.sliding_window=\[8, 16\] has no counterpart in transformers' Ministral format .*one window"),
    (dict(BASE, sliding_window=8, bias=True),
     "model.bias=True has no counterpart in transformers' Ministral format"),
    (dict(QWEN3, sliding_window=8), "model.sliding_window=8 has no counterpart in transformers' Qwen 3"),
    (dict(BASE, attn_sinks=True), "model.attn_sinks=True has no counterpart in transformers' Llama format"),
    (dict(BASE, sliding_window=8, attn_sinks=True),
     "model.attn_sinks=True has no counterpart in transformers' Ministral"),
    (dict(IROPE, sliding_window=8), "model.sliding_window=8 has no counterpart in transformers' Llama 4"),
    (dict(QWEN3, attn_gate="headwise"),
     "model.attn_gate='headwise' has no counterpart in transformers' Qwen3-Next format .*needs "
     "attn_gate='elementwise'"),
    (dict(BASE, attn_gate="elementwise"),
     "model.qk_norm='none' has no counterpart in transformers' Qwen3-Next format"),
    (dict(QWEN3_NEXT, ssmax=True), "model.ssmax=True has no counterpart in transformers' Qwen3-Next"),
    (dict(QWEN3, canon=4), "model.canon=4 has no counterpart in transformers' Qwen 3"),
    (dict(BASE, xsa=True), "model.xsa=True has no counterpart in transformers' Llama"),
    (dict(BASE, attn_fn="sigmoid"),
     "model.attn_fn='sigmoid' has no counterpart in transformers' Llama format .*needs attn_fn='softmax'"),
    (dict(QWEN3, attn_fn="stick_breaking"),
     "model.attn_fn='stick_breaking' has no counterpart in transformers' Qwen 3 format"),
    (dict(BASE, forget_gate=True),
     "model.forget_gate=True has no counterpart in transformers' Llama format .*needs forget_gate=False"),
])
def test_export_refuses_fields_without_a_counterpart(tmp_path, fields, message):
    assert re.match(message, refused(tmp_path, fields))


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("exported")
    return {name: export_hf(model(**fields), root / name) for name, fields in
            [("llama4", IROPE), ("phi3", dict(BASE, rope_fraction=0.5, rope_scaling=longrope(0.5))),
             ("qwen3", QWEN3), ("qwen3_next", QWEN3_NEXT),
             ("ministral", dict(BASE, sliding_window=[WINDOW, None]))]}


def edited(exported: dict[str, Path], name: str, tmp_path: Path, drop: tuple[str, ...] = (),
           **changes) -> Path:
    """A copy of an exported folder with config.json keys changed or dropped."""
    path = shutil.copytree(exported[name], tmp_path / name)
    hf = {key: value for key, value in config_json(path).items() if key not in drop}
    (path / "config.json").write_text(json.dumps({**hf, **changes}))
    return path


@pytest.mark.parametrize("name, drop, changes, message", [
    ("llama4", ("moe_layers",), {}, r"moe_layers=\[0, 1, 2, 3\] is not supported: nanoattn's .* dense"),
    ("llama4", (), dict(interleave_moe_layer_step=2, moe_layers=None), r"moe_layers=\[1, 3\] is not"),
    ("llama4", ("use_qk_norm",), {}, "use_qk_norm=True is not supported"),
    ("llama4", ("attention_chunk_size", "layer_types"), {},
     "layer 0 is 'chunked_attention' .*attention_chunk_size"),
    ("llama4", (), dict(attention_bias=True), "attention_bias=True is not supported"),
    ("llama4", (), dict(no_rope_layers=[1, 2, 1, 0]), r"no_rope_layers=\[1, 2, 1, 0\] is invalid"),
    ("llama4", (), dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    ("llama4", (), dict(rope_parameters={"rope_type": "longrope"}), "rope_type='longrope' has no nanoattn"),
    ("phi3", (), dict(sliding_window=2047), "sliding_window=2047 is not supported"),
    ("phi3", (), dict(rope_parameters={"rope_type": "linear", "factor": 2.0}), "rope_type='linear' has no"),
    ("phi3", (), dict(resid_pdrop=0.1), "differ: nanoattn has one dropout rate"),
    ("qwen3", (), dict(use_sliding_window=True), "use_sliding_window=True is not supported"),
    ("qwen3", (), dict(attention_bias=True), "attention_bias=True is not supported: Qwen 3's MLP"),
    ("qwen3_next", (), dict(layer_types=["linear_attention", "full_attention"] * 2),
     "layer_types=.* is not supported: nanoattn computes only Qwen3-Next's full_attention layers"),
    ("qwen3_next", ("layer_types",), {}, "layer_types=None is not supported"),
    ("qwen3_next", ("num_experts", "mlp_only_layers"), {},
     r"layers \[0, 1, 2, 3\] are mixtures of experts \(num_experts=512\)"),
    ("qwen3_next", (), dict(num_experts=8, mlp_only_layers=[0, 2], decoder_sparse_step=1),
     r"layers \[1, 3\] are mixtures of experts"),
    ("qwen3_next", (), dict(attention_bias=True), "attention_bias=True is not supported: Qwen3-Next's MLP"),
    ("ministral", (), dict(layer_types=["sliding_attention", "chunked_attention"] * 2),
     "layer_types=.* is invalid: must give 'sliding_attention' or 'full_attention'"),
    ("ministral", (), dict(sliding_window=0), "sliding_window=0 is invalid: sliding layers need a positive"),
])
def test_import_refuses_what_nanoattn_cannot_represent(exported, tmp_path, name, drop, changes, message):
    with pytest.raises(ValueError, match=message) as error:
        import_hf(edited(exported, name, tmp_path, drop, **changes))
    assert "\n" not in str(error.value)


def test_a_phi3_config_of_transformers_4_with_type_su_reads_as_longrope(exported, tmp_path):
    rope = {key: value for key, value in config_json(exported["phi3"])["rope_parameters"].items()
            if key not in ("rope_type", "rope_theta")}
    path = edited(exported, "phi3", tmp_path, ("rope_parameters",), rope_scaling={**rope, "type": "su"},
                  rope_theta=10000.0)
    back = import_hf(path)
    assert back.cfg.rope_scaling["type"] == "longrope" and back.cfg.rope_fraction == 0.5
    theirs = load_transformers(path)
    assert theirs.config.rope_parameters["rope_type"] == "longrope"
    assert logits_diff(back, theirs) < ATOL


def test_a_llama4_config_without_no_rope_layers_reads_transformers_default(exported, tmp_path):
    # transformers then makes every 4th layer NoPE (no_rope_layer_interval=4): iRoPE itself.
    path = edited(exported, "llama4", tmp_path, ("no_rope_layers",))
    assert import_hf(path).cfg.pos == ["rope", "rope", "rope", "nope"]
