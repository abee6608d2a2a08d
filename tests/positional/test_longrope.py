"""LongRoPE (``longrope``, Ding et al. 2024, arXiv:2402.13753, as Phi-3 uses it).

What is asserted:

- parity with transformers' ``_compute_longrope_parameters`` (inverse frequencies and attention
  factor, atol=0) in both regimes, for several head dims, bases, factors and original lengths, with
  the factor given or derived (``max_position_embeddings / original``), an explicit attention
  factor, and a partial rotary dim (Phi-4-mini's 96 of 128);
- parity with Phi-3's rotary module end to end (its ``dynamic_rope_update`` switch on
  ``max(position_ids) + 1``): our rotation of the same vectors is bit-identical on both sides of
  the switch, and the switch happens at seq_len = original_max_seq_len + 1 exactly;
- validation: one line naming the key, the list length checked against the rotary dim;
- the KV cache: the rotation changes only when the length crosses L0, a bare cache goes stale
  there, and ``generate`` / ``Decoding`` restart it once and equal recomputation at every step.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch

from nanoattn import GPT, KVCache, ModelConfig, generate
from nanoattn.generate import Decoding
from nanoattn.positional.rope_scaling import (
    longrope_attention_factor,
    normalize_rope_scaling,
    rope_depends_on_length,
    rope_frequencies,
)

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, Phi3Config  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding, apply_rotary_pos_emb  # noqa: E402

DIMS = (16, 64, 128)
THETAS = (10_000.0, 250_000.0)
FACTORS = (1.0, 4.0, 32.0)
ORIGINAL = 4096
LENGTHS = (None, 1, ORIGINAL - 1, ORIGINAL, ORIGINAL + 1, 2 * ORIGINAL, 32 * ORIGINAL + 3)


def pair_factors(pairs: int, seed: int, high: float) -> list[float]:
    """Seeded float64 factors in [1, high], increasing like searched LongRoPE factors."""
    uniform = torch.rand(pairs, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    values = 1 + (high - 1) * uniform
    return values.sort().values.tolist()


def longrope(pairs: int, **extra: Any) -> dict[str, Any]:
    return {"type": "longrope", "short_factor": pair_factors(pairs, 0, 1.5),
            "long_factor": pair_factors(pairs, 1, 40.0), **extra}


def exact(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def hf_rope(params: dict[str, Any], theta: float, *, factor: bool = True) -> dict[str, Any]:
    """Our normalised ``params`` in transformers' ``rope_parameters`` spelling."""
    rope = {"rope_type": "longrope", "rope_theta": theta, "short_factor": params["short_factor"],
            "long_factor": params["long_factor"],
            "original_max_position_embeddings": params["original_max_seq_len"]}
    if factor:
        rope["factor"] = params["factor"]
    if params["attention_factor"] is not None:
        rope["attention_factor"] = params["attention_factor"]
    return rope


def theirs(head_dim: int, rope: dict[str, Any], max_positions: int,
           seq_len=None) -> tuple[torch.Tensor, float]:
    config = LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                         max_position_embeddings=max_positions, rope_parameters=dict(rope))
    return ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=seq_len)


def check_parity(dim: int, theta: float, params: dict[str, Any], max_positions: int, *,
                 factor: bool = True, rotary_dim: int | None = None, **rope_extra: Any) -> None:
    rotary_dim = rotary_dim or dim
    for seq_len in LENGTHS:
        inv_freq, attention = rope_frequencies(rotary_dim, theta, params, seq_len=seq_len)
        ref_inv_freq, ref_attention = theirs(dim, {**hf_rope(params, theta, factor=factor), **rope_extra},
                                             max_positions, seq_len=seq_len)
        assert inv_freq.shape == (rotary_dim // 2,)
        exact(inv_freq, ref_inv_freq)
        assert attention == ref_attention


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("dim,theta,factor", list(itertools.product(DIMS, THETAS, FACTORS)))
@pytest.mark.parametrize("original", [ORIGINAL, 512])
def test_matches_transformers_with_explicit_factor(dim: int, theta: float, factor: float,
                                                   original: int) -> None:
    params = normalize_rope_scaling(longrope(dim // 2, factor=factor, original_max_seq_len=original), 256)
    # max_position_embeddings is ignored when the factor is given: an unrelated value proves it.
    check_parity(dim, theta, params, max_positions=1000)


@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("max_seq_len", [ORIGINAL, ORIGINAL + 1, 3 * ORIGINAL + 5, 32 * ORIGINAL])
def test_factor_defaults_to_the_context_ratio_as_in_transformers(dim: int, max_seq_len: int) -> None:
    # Phi-3-mini-128k's config has no factor: max_position_embeddings 131072 / original 4096.
    scaling = longrope(dim // 2, original_max_position_embeddings=ORIGINAL)
    params = normalize_rope_scaling(scaling, max_seq_len)
    assert params["factor"] == max_seq_len / ORIGINAL
    check_parity(dim, 10_000.0, params, max_positions=max_seq_len, factor=False)
    # Without an original length either, both take the model's context: factor 1, attention 1.
    params = normalize_rope_scaling(longrope(dim // 2), max_seq_len)
    assert (params["factor"], params["original_max_seq_len"]) == (1.0, max_seq_len)
    assert rope_frequencies(dim, 10_000.0, params)[1] == 1.0


@pytest.mark.parametrize("attention_factor", [0.5, 1.0, 1.19])
def test_explicit_attention_factor_matches_transformers(attention_factor: float) -> None:
    params = normalize_rope_scaling(longrope(32, factor=32.0, attention_factor=attention_factor), ORIGINAL)
    check_parity(64, 10_000.0, params, max_positions=32 * ORIGINAL)
    assert rope_frequencies(64, 10_000.0, params, seq_len=5 * ORIGINAL)[1] == attention_factor


def test_partial_rotary_dim_matches_transformers() -> None:
    # Phi-4-mini: head_dim 128, partial_rotary_factor 0.75, so 48 factors for the rotary dim 96.
    params = normalize_rope_scaling(longrope(48, factor=32.0, original_max_seq_len=ORIGINAL), ORIGINAL)
    check_parity(128, 10_000.0, params, max_positions=32 * ORIGINAL, rotary_dim=96,
                 partial_rotary_factor=0.75)


@pytest.mark.parametrize("factor", [1.0, 1.5, 4.0, 32.0])
@pytest.mark.parametrize("original", [2, 4096, 8192])
def test_attention_factor_formula(factor: float, original: int) -> None:
    expected = 1.0 if factor == 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    assert longrope_attention_factor(factor, original) == expected
    assert longrope_attention_factor(factor, original, 1.25) == 1.25
    params = normalize_rope_scaling(longrope(8, factor=factor, original_max_seq_len=original), 1)
    for seq_len in (None, 1, original, original + 1, 100 * original):  # the same in both regimes
        assert rope_frequencies(16, 10_000.0, params, seq_len=seq_len)[1] == expected


# ----------------------------------------------------------------------------- the switch


@pytest.mark.parametrize("dim,theta", list(itertools.product(DIMS, THETAS)))
def test_short_factors_up_to_the_original_length_long_ones_past_it(dim: int, theta: float) -> None:
    params = normalize_rope_scaling(longrope(dim // 2, factor=16.0), ORIGINAL)
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    short = 1.0 / (torch.tensor(params["short_factor"], dtype=torch.float32) * theta ** exponent)
    long = 1.0 / (torch.tensor(params["long_factor"], dtype=torch.float32) * theta ** exponent)
    for seq_len in (None, 1, ORIGINAL // 2, ORIGINAL - 1, ORIGINAL):
        exact(rope_frequencies(dim, theta, params, seq_len=seq_len)[0], short)
    for seq_len in (ORIGINAL + 1, ORIGINAL + 2, 16 * ORIGINAL, 100 * ORIGINAL):
        exact(rope_frequencies(dim, theta, params, seq_len=seq_len)[0], long)
    plain = rope_frequencies(dim, theta, None)[0]
    torch.testing.assert_close(long, plain / torch.tensor(params["long_factor"]).float(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("head_dim,partial", [(64, 1.0), (128, 0.75)])
def test_rotation_equals_phi3_rotary_module_across_the_switch(head_dim: int, partial: float) -> None:
    """Phi-3's module picks long factors when max(position_ids) + 1 > original (dynamic_rope_update):
    at seq_len = L0 + 1, whether the whole sequence or one decoded position is passed."""
    original, n_head, theta = 64, 2, 10_000.0
    rotary = int(head_dim * partial)
    scaling = longrope(rotary // 2, original_max_seq_len=original)  # factor from max_seq_len / original
    cfg = ModelConfig(vocab_size=32, d_model=n_head * head_dim, n_layer=1, n_head=n_head, d_ff=32,
                      max_seq_len=8 * original, rope_theta=theta, rope_fraction=partial, rope_scaling=scaling)
    pos = GPT(cfg).pos.for_layer(0)
    # Partial RoPE rotates rope_fraction of each head (rope.py); the frequencies are compared anyway.
    whole_model = getattr(pos, "rotary_dim", head_dim) == rotary
    phi3 = Phi3Config(hidden_size=n_head * head_dim, num_attention_heads=n_head,
                      max_position_embeddings=8 * original,
                      original_max_position_embeddings=original, partial_rotary_factor=partial,
                      rope_parameters={"rope_type": "longrope", "rope_theta": theta,
                                       "short_factor": scaling["short_factor"],
                                       "long_factor": scaling["long_factor"]})
    module = Phi3RotaryEmbedding(phi3)
    x = torch.randn(1, n_head, 3 * original, head_dim, generator=torch.Generator().manual_seed(0))
    cases = [torch.arange(original), torch.arange(original + 1), torch.arange(3 * original),
             torch.tensor([original - 1]), torch.tensor([original]), torch.arange(original - 4, original + 4)]
    for positions in cases:
        seq_len = int(positions.max()) + 1
        q = x[:, :, :len(positions)]
        cos, sin = module(q, positions[None])  # [1, T, rotary]
        ref = apply_rotary_pos_emb(q, q, cos, sin)[0]
        if whole_model:
            exact(pos.rotate(q, positions, seq_len), ref)
        inv_freq, attention = rope_frequencies(rotary, theta, cfg.rope_scaling, seq_len=seq_len)
        exact(inv_freq, module.inv_freq)
        assert attention == module.attention_scaling
        regime = "long_factor" if seq_len > original else "short_factor"
        exact(inv_freq, rope_frequencies(rotary, theta, {**cfg.rope_scaling,
                                                         "short_factor": cfg.rope_scaling[regime]})[0])


# ----------------------------------------------------------------------------- normalisation


def test_defaults_spellings_and_idempotence() -> None:
    hf = {"rope_type": "longrope", "short_factor": (1, 1.5), "long_factor": [2, 3.25],
          "original_max_position_embeddings": 4096, "factor": 32}
    ours = normalize_rope_scaling(hf, 256)
    assert ours == {"type": "longrope", "factor": 32.0, "original_max_seq_len": 4096,
                    "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.25], "attention_factor": None}
    assert type(ours["short_factor"]) is list and all(type(v) is float for v in ours["short_factor"])
    assert normalize_rope_scaling(ours, 999_999) == ours  # the derived or given factor is kept
    derived = normalize_rope_scaling({**hf, "factor": None}, 131072)
    assert derived["factor"] == 32.0 and normalize_rope_scaling(derived, 512) == derived


def test_accepts_omegaconf_mappings() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"type": "longrope", "factor": 4, "short_factor": [1, 1.5],
                                      "long_factor": [2, 4]})
    out = normalize_rope_scaling(cfg, 256)
    assert type(out) is dict and out["long_factor"] == [2.0, 4.0] and type(out["long_factor"]) is list


def test_depends_on_length() -> None:
    assert rope_depends_on_length(normalize_rope_scaling(longrope(4, factor=2), 256))
    assert rope_depends_on_length({"rope_type": "longrope"})


@pytest.mark.parametrize("kind", ["longrope"])
def test_float32_from_int64_arange_even_under_autocast_and_float64_default(kind: str) -> None:
    params = normalize_rope_scaling(longrope(64, factor=4.0), ORIGINAL)
    reference = [rope_frequencies(128, 500_000.0, params, seq_len=n)[0] for n in (ORIGINAL, 3 * ORIGINAL)]
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            again = [rope_frequencies(128, 500_000.0, params, seq_len=n)[0] for n in (ORIGINAL, 3 * ORIGINAL)]
    finally:
        torch.set_default_dtype(previous)
    for ours, ref in zip(again, reference, strict=True):
        exact(ours, ref)


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("scaling,max_seq_len,key", [
    ({"type": "longrope", "long_factor": [1.0]}, 256, "short_factor"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": None}, 256, "long_factor"),
    ({"type": "longrope", "short_factor": "1 2", "long_factor": [1.0, 2.0]}, 256, "short_factor"),
    ({"type": "longrope", "short_factor": 2.0, "long_factor": [1.0]}, 256, "short_factor"),
    ({"type": "longrope", "short_factor": [], "long_factor": []}, 256, "short_factor"),
    ({"type": "longrope", "short_factor": {"a": 1}, "long_factor": [1.0]}, 256, "short_factor"),
    ({"type": "longrope", "short_factor": [1.0, -1.0], "long_factor": [1.0, 1.0]}, 256, "short_factor[1]"),
    ({"type": "longrope", "short_factor": [1.0, 0], "long_factor": [1.0, 1.0]}, 256, "short_factor[1]"),
    ({"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [1.0, float("nan")]}, 256,
     "long_factor[1]"),
    ({"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [True, 1.0]}, 256, "long_factor[0]"),
    ({"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": ["2", 1.0]}, 256, "long_factor[0]"),
    ({"type": "longrope", "short_factor": [1.0, 1.0], "long_factor": [1.0, 1.0, 1.0]}, 256, "long_factor"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "attention_factor": 0}, 256,
     "attention_factor"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "attention_factor": "1"}, 256,
     "attention_factor"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "factor": 0.5}, 256, "factor"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_seq_len": 4096}, 2048,
     "factor"),  # derived 2048 / 4096 < 1
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "factor": 2,
      "original_max_seq_len": 1}, 256, "original_max_seq_len"),  # ln(1) = 0 in the attention factor
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "beta_fast": 32}, 256, "beta_fast"),
    ({"type": "longrope", "short_factor": [1.0], "long_factor": [1.0], "original_max_seq_len": 0}, 256,
     "original_max_seq_len"),
], ids=str)
def test_bad_mappings_name_the_key(scaling: dict[str, Any], max_seq_len: int, key: str) -> None:
    with pytest.raises(ValueError) as info:
        normalize_rope_scaling(scaling, max_seq_len)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"model.rope_scaling.{key}")


def test_list_length_is_checked_against_the_rotary_dim() -> None:
    params = normalize_rope_scaling(longrope(32, factor=4.0), ORIGINAL)
    rope_frequencies(64, 10_000.0, params)  # 32 pairs: fine
    with pytest.raises(ValueError) as info:
        rope_frequencies(128, 10_000.0, params)
    assert str(info.value) == ("model.rope_scaling.short_factor is invalid: it has 32 entries, but "
                               "rotary dim 128 has 64 pairs (one factor per pair)")
    # Checked in both regimes: a wrong length fails before the length ever crosses L0.
    for seq_len in (1, 10 * ORIGINAL):
        with pytest.raises(ValueError, match="short_factor"):
            rope_frequencies(48, 10_000.0, params, seq_len=seq_len)
    # ...and through the model config: the first forward pass names the key.
    cfg = ModelConfig(vocab_size=16, d_model=32, n_layer=1, n_head=2, d_ff=32, max_seq_len=16,
                      rope_scaling=longrope(4, factor=2.0))  # head_dim 16 needs 8
    with pytest.raises(ValueError, match=r"^model\.rope_scaling\.short_factor is invalid: it has 4 entries"):
        GPT(cfg)(torch.zeros(1, 4, dtype=torch.long))


# ----------------------------------------------------------------------------- KV cache

MAX_SEQ_LEN = 16  # also L0: original_max_seq_len defaults to the model's context
PROMPT = 5
NEW = 2 * MAX_SEQ_LEN - PROMPT  # decoding crosses L0 at length 17
PENALTY = 3.0  # enough that greedy decoding of a random model does not repeat one token
TINY_SCALING = {"type": "longrope", "factor": 4.0, "short_factor": [1.0, 1.0, 1.25, 1.5],
                "long_factor": [1.0, 2.0, 4.0, 8.0]}  # head_dim 8: 4 pairs


def tiny(scaling: dict[str, Any] = TINY_SCALING) -> GPT:
    """tests/test_generate.py's tiny model (2 layers, GQA, head_dim 8) with a LongRoPE scaling."""
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64,
                           max_seq_len=MAX_SEQ_LEN, rope_scaling=scaling, init_std=0.1)).eval()


def prompt(length: int = PROMPT) -> torch.Tensor:
    return torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(1))


def test_rotation_changes_only_when_the_length_crosses_the_original_one() -> None:
    pos = tiny().pos
    assert pos.length_dependent_rotation
    lengths = (1, PROMPT, MAX_SEQ_LEN - 1, MAX_SEQ_LEN, MAX_SEQ_LEN + 1, MAX_SEQ_LEN + 2, 5 * MAX_SEQ_LEN)
    for old, new in itertools.product(lengths, repeat=2):
        assert pos.rotation_changes(old, new) == ((old > MAX_SEQ_LEN) != (new > MAX_SEQ_LEN)), (old, new)
    same = tiny({**TINY_SCALING, "long_factor": TINY_SCALING["short_factor"]}).pos
    assert not any(same.rotation_changes(old, new) for old, new in itertools.product(lengths, repeat=2))


def test_bare_cache_goes_stale_at_the_switch_and_only_there() -> None:
    """Keys (and deeper layers' values) cached under short factors are stale once the length passes
    L0; a cache filled past L0 stays exact, since long factors then hold at every length."""
    model = tiny()
    length = 2 * MAX_SEQ_LEN
    idx = prompt(length)
    with torch.no_grad():
        one_pass = model(idx)  # [B, T, V], long factors everywhere
        short = model(idx[:, :MAX_SEQ_LEN])  # short factors
        cache = KVCache(model.cfg, 2, length)
        within = model(idx[:, :MAX_SEQ_LEN], cache=cache)
        stale = model(idx[:, MAX_SEQ_LEN:MAX_SEQ_LEN + 4], cache=cache)
        fresh = KVCache(model.cfg, 2, length)
        refilled = model(idx[:, :MAX_SEQ_LEN + 1], cache=fresh)
        steps = [model(idx[:, n:n + 1], cache=fresh)[:, 0] for n in range(MAX_SEQ_LEN + 1, length)]
    torch.testing.assert_close(within, short, rtol=0, atol=0)
    assert (stale - one_pass[:, MAX_SEQ_LEN:MAX_SEQ_LEN + 4]).abs().max() > 1e-3
    torch.testing.assert_close(refilled, one_pass[:, :MAX_SEQ_LEN + 1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.stack(steps, 1), one_pass[:, MAX_SEQ_LEN + 1:], atol=1e-5, rtol=1e-5)


def test_generate_restarts_the_cache_once_and_equals_recomputation() -> None:
    model = tiny()
    idx = prompt()
    greedy = dict(temperature=0, repetition_penalty=PENALTY)
    cached = generate(model, idx, NEW, **greedy)
    assert len(set(cached[0, PROMPT:].tolist())) > 5  # a varied sequence, not one token repeated
    assert torch.equal(cached, generate(model, idx, NEW, use_cache=False, **greedy))
    sampled = [generate(model, idx, NEW, use_cache=use_cache, generator=torch.Generator().manual_seed(3))
               for use_cache in (True, False)]
    assert torch.equal(sampled[0], sampled[1])

    decoding = Decoding(model, idx, NEW, **greedy)
    filled = []
    for step, _ in enumerate(decoding):
        filled.append(decoding.filled_at)
        with torch.no_grad():
            recomputed = model(decoding.idx[:, :PROMPT + step])[:, -1]  # [B, V]
        torch.testing.assert_close(decoding.last_logits, recomputed, atol=1e-5, rtol=1e-5)
    # Filled at the prompt, re-encoded once when the context reached L0 + 1 tokens, kept after.
    assert sorted(set(filled)) == [PROMPT, MAX_SEQ_LEN + 1]
    assert filled.index(MAX_SEQ_LEN + 1) == MAX_SEQ_LEN + 1 - PROMPT

    # A prompt already past L0 never restarts; decoding that stays within L0 never does either.
    past = Decoding(model, prompt(MAX_SEQ_LEN + 3), 8, **greedy)
    assert {past.filled_at for _ in past} == {MAX_SEQ_LEN + 3}
    within = Decoding(model, idx, MAX_SEQ_LEN - PROMPT, **greedy)
    assert {within.filled_at for _ in within} == {PROMPT}
