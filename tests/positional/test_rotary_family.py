"""Partial RoPE, p-RoPE and xPos against hand computations, transformers and the papers' counts.

References: a rotation written out pair by pair in float64; transformers' GPT-NeoX / Phi rotary
embeddings (``partial_rotary_factor``), its YaRN with a partial factor, and its ``proportional``
type, which is p-RoPE with the count of Barbero et al.'s pseudocode; xPos's score
sum_i zeta_i^((m - n)/gamma) * (RoPE score of pair i) with torchscale's zeta.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPTNeoXConfig, LlamaConfig, PhiConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention, GPTNeoXRotaryEmbedding
from transformers.models.phi.modeling_phi import PhiAttention, PhiRotaryEmbedding

from nanoattn import GPT, ModelConfig
from nanoattn.generate import Decoding, generate
from nanoattn.positional import REGISTRY, build_positional
from nanoattn.positional.rope import p_rope_kept, rotary_dim
from nanoattn.positional.xpos import XPosPositionalEncoding, xpos_max_distance, xpos_zeta


def encoding(head_dim: int = 16, **overrides):
    cfg = ModelConfig(d_model=2 * head_dim, n_head=2, **overrides)
    return build_positional(cfg)


def hand_rotation(x: torch.Tensor, m: int, rotary: int, inv_freq: list[float]) -> torch.Tensor:
    """float64 half-split rotation of x [head_dim] at position m over its first ``rotary`` dims."""
    out = x.double().clone()
    half = rotary // 2
    for i, freq in enumerate(inv_freq):
        a, b = x[i].item(), x[i + half].item()
        c, s = math.cos(m * freq), math.sin(m * freq)
        out[i], out[i + half] = a * c - b * s, b * c + a * s
    return out


def score(pos, q, k, m: int, n: int) -> torch.Tensor:
    """q [D] at position m against k [D] at n, through rotate and the query/key maps."""
    qm = pos.scale_queries(pos.rotate(q.view(1, 1, 1, -1), torch.tensor([m]), m + 1), torch.tensor([m]))
    kn = pos.scale_keys(pos.rotate(k.view(1, 1, 1, -1), torch.tensor([n]), n + 1), torch.tensor([n]))
    return (qm * kn).sum()


# ----------------------------------------------------------------------------- partial RoPE


def test_partial_rope_rotates_the_first_dims_and_passes_the_rest():
    rope = encoding(16, rope_fraction=0.5)
    assert rope.rotary_dim == 8
    x = torch.randn(16)
    for m in (0, 3, 101):
        out = rope.rotate(x.view(1, 1, 1, 16), torch.tensor([m]), m + 1).view(16)
        expected = hand_rotation(x, m, 8, [10000 ** (-2 * i / 8) for i in range(4)])
        torch.testing.assert_close(out[:8].double(), expected[:8], atol=1e-5, rtol=0)
        assert torch.equal(out[8:], x[8:])  # untouched, bit for bit


def test_full_fraction_rotates_every_dim_as_before():
    rope = encoding(16)
    assert rope.rotary_dim == rope.head_dim == 16 and rope.kept == 8
    x = torch.randn(16)
    out = rope.rotate(x.view(1, 1, 1, 16), torch.tensor([7]), 8).view(16)
    torch.testing.assert_close(out.double(), hand_rotation(x, 7, 16, [10000 ** (-i / 8) for i in range(8)]),
                               atol=1e-5, rtol=0)


def test_the_rotation_kept_for_the_next_layer_follows_its_positions_and_dtype():
    """Layers reuse the last cos/sin while the positions are equal: positions changed in place, other
    positions or another dtype get their own, as a fresh encoding computes them."""
    rope, fresh = encoding(16), encoding(16)
    x = torch.randn(2, 3, 5, 16)
    positions = torch.arange(5)
    first = rope.rotate(x, positions, 9)
    assert torch.equal(rope.rotate(x, positions, 9), first)
    positions.add_(4)  # in place: the same tensor at other positions
    assert torch.equal(rope.rotate(x, positions, 9), fresh.rotate(x, torch.arange(4, 9), 9))
    assert not torch.equal(rope.rotate(x, positions, 9), first)
    half = rope.rotate(x.bfloat16(), positions, 9)
    assert half.dtype == torch.bfloat16
    assert torch.equal(half, fresh.rotate(x.bfloat16(), torch.arange(4, 9), 9))


@pytest.mark.parametrize("head_dim,fraction", [(96, 0.25), (48, 0.3), (80, 0.4), (64, 0.5), (32, 1.0)])
def test_partial_cos_sin_equal_transformers(head_dim, fraction):
    """GPT-NeoX's rotary embedding with partial_rotary_factor (rotary_pct): the same rotary dim,
    inverse frequencies and cos/sin, bit for bit; Phi's rotary_ndims agrees."""
    hf = GPTNeoXConfig(hidden_size=2 * head_dim, num_attention_heads=2, rotary_pct=fraction)
    theirs, factor = GPTNeoXRotaryEmbedding.compute_default_rope_parameters(hf)
    rope = encoding(head_dim, rope_fraction=fraction)
    assert rope.rotary_dim == GPTNeoXAttention(hf, 0).rotary_ndims == int(head_dim * fraction)
    phi = PhiConfig(hidden_size=2 * head_dim, num_attention_heads=2, partial_rotary_factor=fraction)
    assert PhiAttention(phi, 0).rotary_ndims == rope.rotary_dim
    phi_inv_freq = PhiRotaryEmbedding.compute_default_rope_parameters(phi)[0]
    torch.testing.assert_close(phi_inv_freq, theirs, atol=0, rtol=0)
    ours, our_factor = rope.frequencies()
    assert our_factor == factor
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)
    positions = torch.arange(300)
    cos, sin = GPTNeoXRotaryEmbedding(hf)(torch.zeros(1, 300, 4), positions[None])
    our_cos, our_sin = rope.cos_sin(300, torch.device("cpu"))
    torch.testing.assert_close(torch.cat((our_cos, our_cos), -1)[positions], cos[0], atol=0, rtol=0)
    torch.testing.assert_close(torch.cat((our_sin, our_sin), -1)[positions], sin[0], atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["linear", "yarn", "llama3"])
def test_partial_rope_scalings_are_computed_on_the_rotary_dim(kind):
    """transformers computes every scaling on int(head_dim * partial_rotary_factor) dims; so do we."""
    params = {"rope_type": kind, "rope_theta": 10000.0, "factor": 4.0, "partial_rotary_factor": 0.5,
              "original_max_position_embeddings": 64}
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)  # our defaults
    hf = LlamaConfig(hidden_size=128, num_attention_heads=2, max_position_embeddings=256,
                     rope_parameters=params)
    theirs, their_factor = ROPE_INIT_FUNCTIONS[kind](hf)
    scaling = {"type": kind, "factor": 4.0, "original_max_seq_len": 64}
    ours, our_factor = encoding(64, rope_fraction=0.5, rope_scaling=scaling, max_seq_len=256).frequencies()
    assert ours.shape == (16,) and our_factor == pytest.approx(their_factor, rel=1e-15)
    torch.testing.assert_close(ours, theirs, atol=0, rtol=0)


def test_odd_head_dim_is_fine_when_the_rotary_dim_is_even():
    cfg = ModelConfig(vocab_size=16, d_model=36, n_layer=1, n_head=4, rope_fraction=0.5, max_seq_len=8)
    assert cfg.head_dim == 9 and build_positional(cfg).rotary_dim == 4
    assert GPT(cfg)(torch.zeros(1, 8, dtype=torch.long)).isfinite().all()


# ----------------------------------------------------------------------------- p-RoPE


@pytest.mark.parametrize("dim,p,kept", [(64, 0.75, 24), (64, 0.25, 8), (64, 0.1, 3), (16, 0.3, 2),
                                        (10, 0.7, 3), (64, 1.0, 32), (8, 0.5, 2)])
def test_p_rope_keeps_the_papers_count(dim, p, kept):
    """rope_angles = int(rope_percentage * head_dim // 2) in the paper's pseudocode: a floor."""
    assert p_rope_kept(dim, p) == kept == int(p * dim // 2)


@pytest.mark.parametrize("p", [0.25, 0.5, 0.75, 0.9])
def test_p_rope_zeroes_the_lowest_frequencies_and_equals_transformers_proportional(p):
    rope = encoding(64, rope_p=p)
    full = encoding(64).frequencies()[0]
    inv_freq = rope.frequencies()[0]
    kept = int(p * 64 // 2)
    assert rope.kept == kept
    assert torch.equal(inv_freq[:kept], full[:kept])  # the highest frequencies, unchanged
    assert torch.equal(inv_freq[kept:], torch.zeros(32 - kept))  # the lowest ones, dropped
    assert full[kept:].max() < full[:kept].min()
    params = {"rope_type": "proportional", "rope_theta": 10000.0, "partial_rotary_factor": p}
    hf = LlamaConfig(hidden_size=128, num_attention_heads=2, rope_parameters=params)
    torch.testing.assert_close(inv_freq, ROPE_INIT_FUNCTIONS["proportional"](hf)[0], atol=0, rtol=0)


def test_p_rope_leaves_the_dropped_pairs_unrotated():
    rope = encoding(16, rope_p=0.5)  # 4 of 8 pairs kept: dims 4..7 and 12..15 not rotated
    x = torch.randn(16)
    out = rope.rotate(x.view(1, 1, 1, 16), torch.tensor([9]), 10).view(16)
    assert torch.equal(out[4:8], x[4:8]) and torch.equal(out[12:], x[12:])
    expected = hand_rotation(x, 9, 16, [10000 ** (-i / 8) for i in range(4)])
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=0)


def test_p_rope_and_partial_rope_combine_on_the_rotary_dims():
    """rope_fraction 0.5 of 32 dims = 16 rotate; p = 0.5 keeps int(0.5 * 16 // 2) = 4 of their 8
    frequencies, theta^(-2i/16); dims 16.. pass through."""
    rope = encoding(32, rope_fraction=0.5, rope_p=0.5, rope_scaling={"type": "linear", "factor": 2.0})
    inv_freq = rope.frequencies()[0]
    expected = torch.tensor([10000 ** (-2 * i / 16) / 2 if i < 4 else 0.0 for i in range(8)])
    torch.testing.assert_close(inv_freq, expected, atol=1e-7, rtol=1e-6)
    x = torch.randn(32)
    out = rope.rotate(x.view(1, 1, 1, 32), torch.tensor([5]), 6).view(32)
    for unrotated in (slice(4, 8), slice(12, 16), slice(16, 32)):
        assert torch.equal(out[unrotated], x[unrotated])


# ----------------------------------------------------------------------------- relative positions


@pytest.mark.parametrize("overrides", [dict(rope_fraction=0.5), dict(rope_p=0.5),
                                       dict(rope_fraction=0.25, rope_p=0.5), dict(pos="xpos"),
                                       dict(pos="xpos", rope_fraction=0.5, rope_p=0.75)])
def test_scores_depend_only_on_the_relative_position(overrides):
    pos = encoding(32, **overrides)
    torch.manual_seed(0)
    q, k = torch.randn(32), torch.randn(32)
    for m, n in [(5, 2), (10, 10), (40, 1)]:
        base = score(pos, q, k, m, n)
        for offset in (1, 17, 1000):
            torch.testing.assert_close(score(pos, q, k, m + offset, n + offset), base, atol=2e-3, rtol=1e-3)
    assert not torch.allclose(score(pos, q, k, 5, 2), score(pos, q, k, 5, 3))


# ----------------------------------------------------------------------------- xPos


def test_xpos_zeta_and_scale_base_are_torchscales():
    d = 16
    assert torch.equal(xpos_zeta(d), (torch.arange(0, d, 2).double() + 0.4 * d) / (1.4 * d))
    torch.testing.assert_close(xpos_zeta(d), torch.tensor([(2 * i / d + 0.4) / 1.4 for i in range(8)],
                                                          dtype=torch.float64))
    assert ModelConfig().xpos_scale_base == 512.0
    assert REGISTRY["xpos"] is XPosPositionalEncoding and XPosPositionalEncoding.rotary


@pytest.mark.parametrize("m,n", [(0, 0), (7, 3), (300, 20), (2000, 1990), (5000, 100)])
def test_xpos_score_is_the_decayed_rope_score(m, n):
    """q_m . k_n = sum_i zeta_i^((m - n)/gamma) * (RoPE score of pair i), computed by hand."""
    d, gamma = 16, 512.0
    xpos = encoding(d, pos="xpos", max_seq_len=64)
    torch.manual_seed(1)
    q, k = torch.randn(d), torch.randn(d)
    inv_freq = [10000 ** (-2 * i / d) for i in range(d // 2)]
    qr, kr = hand_rotation(q, m, d, inv_freq), hand_rotation(k, n, d, inv_freq)
    zeta = [(2 * i / d + 0.4) / 1.4 for i in range(d // 2)]
    expected = sum(zeta[i] ** ((m - n) / gamma) * (qr[i] * kr[i] + qr[i + d // 2] * kr[i + d // 2])
                   for i in range(d // 2))
    assert score(xpos, q, k, m, n).item() == pytest.approx(expected.item(), abs=2e-4 * (1 + m / 1000))


def test_xpos_scales_queries_and_keys_per_pair_at_their_own_positions():
    xpos = encoding(16, pos="xpos", max_seq_len=64)  # offset c = 32
    c, gamma = 32, 512.0
    positions = torch.tensor([0, 5, 32, 900])
    ones = torch.ones(1, 1, 4, 16)
    zeta = xpos_zeta(16)
    expected_q = zeta[None, :] ** ((positions.double()[:, None] - c) / gamma)  # [4, 8]
    q, k = xpos.scale_queries(ones, positions)[0, 0], xpos.scale_keys(ones, positions)[0, 0]
    torch.testing.assert_close(q.double(), torch.cat((expected_q, expected_q), -1), atol=0, rtol=2e-6)
    torch.testing.assert_close(k.double(), 1 / torch.cat((expected_q, expected_q), -1), atol=0, rtol=2e-6)


def test_xpos_does_not_decay_the_dims_that_do_not_rotate():
    xpos = encoding(32, pos="xpos", rope_fraction=0.5, rope_p=0.5)  # pairs 0..3 of 16 rotary dims decay
    q = xpos.scale_queries(torch.ones(1, 1, 1, 32), torch.tensor([1000]))[0, 0, 0]
    assert (q[:4] < 1).all() and (q[8:12] < 1).all()
    assert torch.equal(q[4:8], torch.ones(4)) and torch.equal(q[12:], torch.ones(20))
    # zeta from the rotary dim: zeta_1 = (2/16 + 0.4)/1.4
    assert q[1].item() == pytest.approx(((2 / 16 + 0.4) / 1.4) ** ((1000 - 128) / 512), rel=1e-6)


def test_xpos_refuses_lengths_past_its_float_range():
    xpos = encoding(16, pos="xpos", max_seq_len=64)
    limit = xpos_max_distance(512.0)
    assert limit == 28328  # int(100 ln 2 * 512 / ln 3.5)
    xpos.check_length(32 + limit + 1)  # last position 32 + limit: at the bound
    with pytest.raises(ValueError, match=r"length 28362 is past xPos's float range.*xpos_scale_base"):
        xpos.check_length(32 + limit + 2)
    far = torch.tensor([32 + limit])
    ones = torch.ones(1, 1, 1, 16)
    for factor in (xpos.scale_queries(ones, far), xpos.scale_keys(ones, far)):
        assert factor.isfinite().all() and (factor > 2.0**-101).all() and (factor < 2.0**101).all()


def test_xpos_under_float16_refuses_positions_whose_keys_would_overflow():
    xpos = encoding(16, pos="xpos", max_seq_len=64)
    limit = xpos_max_distance(512.0, 8.0)
    k = torch.ones(1, 1, 1, 16, dtype=torch.float16)
    assert xpos.scale_keys(k, torch.tensor([32 + limit])).isfinite().all()
    with pytest.raises(ValueError, match="float16.*bfloat16 or float32"):
        xpos.scale_keys(k, torch.tensor([32 + limit + 1]))


# ----------------------------------------------------------------------------- config errors


@pytest.mark.parametrize("overrides,match", [
    (dict(rope_fraction=0), r"model\.rope_fraction=0 is invalid: must be in \(0, 1\]"),
    (dict(rope_fraction=1.5), r"model\.rope_fraction=1\.5 is invalid: must be in \(0, 1\]"),
    (dict(rope_fraction="half"), r"model\.rope_fraction='half' is invalid"),
    (dict(rope_fraction=True), r"model\.rope_fraction=True is invalid"),
    (dict(rope_fraction=0.2),
     r"model\.rope_fraction=0\.2 is invalid: rotates .*int\(16 \* 0\.2\) = 3 dims.*even"),
    (dict(rope_fraction=0.1), r"model\.rope_fraction=0\.1 is invalid: rotates .* = 1 dims.*>= 2"),
    (dict(rope_p=0), r"model\.rope_p=0 is invalid: must be in \(0, 1\]"),
    (dict(rope_p=-0.5), r"model\.rope_p=-0\.5 is invalid: must be in \(0, 1\]"),
    (dict(rope_p=1.01), r"model\.rope_p=1\.01 is invalid"),
    (dict(rope_p=0.1), r"model\.rope_p=0\.1 is invalid: keeps int\(rope_p \* rotary_dim // 2\) = 0 of the 8"),
    (dict(d_model=36, n_head=4), r"model\.d_model=36 is invalid: rotary positions need an even head_dim"),
    (dict(pos="xpos", rope_fraction=0), r"model\.rope_fraction=0 is invalid"),
    (dict(pos="xpos", xpos_scale_base=0), r"model\.xpos_scale_base=0 is invalid: must be a positive number"),
    (dict(pos="xpos", xpos_scale_base=float("inf")), r"model\.xpos_scale_base=inf is invalid"),
    (dict(pos="xpos", xpos_scale_base=10.0, max_seq_len=2048),
     r"model\.xpos_scale_base=10\.0 is invalid: must be >= 18\.508 for max_seq_len=2048"),
    (dict(pos=["rope", "nope"], rope_p=2.0), r"model\.rope_p=2\.0 is invalid"),
])
def test_bad_rotary_configs_are_one_line_errors(overrides, match):
    base = dict(d_model=32, n_head=2)
    with pytest.raises(ValueError, match=match) as error:
        ModelConfig(**{**base, **overrides})
    assert "\n" not in str(error.value)


def test_rotary_fields_are_ignored_without_a_rotary_encoding():
    ModelConfig(d_model=32, n_head=2, pos="alibi", rope_fraction=0.5, rope_p=0.5)
    assert rotary_dim(16, 0.5) == 8


# ----------------------------------------------------------------------------- models


def tiny(**overrides) -> GPT:
    torch.manual_seed(0)
    cfg = dict(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64, max_seq_len=16,
               init_std=0.1)
    return GPT(ModelConfig(**{**cfg, **overrides})).eval()


DYNAMIC = {"type": "dynamic", "factor": 2.0}


@pytest.mark.parametrize("overrides", [dict(rope_fraction=0.5), dict(rope_p=0.5),
                                       dict(rope_fraction=0.5, rope_p=0.5, rope_scaling=DYNAMIC),
                                       dict(pos="xpos", rope_fraction=0.5, rope_p=0.5)])
def test_cached_decoding_equals_recomputation(overrides):
    """As tests/test_generate.py::check_cached_decoding, to 8 tokens past max_seq_len = 16."""
    model = tiny(**overrides)
    prompt = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(1))
    n, greedy = 19, dict(temperature=0, repetition_penalty=3.0)
    cached = generate(model, prompt, n, **greedy)
    assert len(set(cached[0, 5:].tolist())) > 5
    assert torch.equal(cached, generate(model, prompt, n, use_cache=False, **greedy))
    sampled = [generate(model, prompt, n, use_cache=use_cache, generator=torch.Generator().manual_seed(3))
               for use_cache in (True, False)]
    assert torch.equal(sampled[0], sampled[1])
    decoding = Decoding(model, prompt, n, **greedy)
    for step, _ in enumerate(decoding):
        with torch.no_grad():
            recomputed = model(decoding.idx[:, :5 + step])[:, -1]
        torch.testing.assert_close(decoding.last_logits, recomputed, atol=1e-5, rtol=1e-5)


def test_xpos_nope_layout_trains():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=32, d_model=32, n_layer=2, n_head=2, d_ff=64, max_seq_len=32,
                            pos=["xpos", "nope"], xpos_scale_base=64.0))
    assert [type(model.pos.for_layer(i)).__name__ for i in range(2)] == ["XPosPositionalEncoding",
                                                                         "NoPositionalEncoding"]
    idx = torch.arange(32).repeat(4, 2)[:, :33] % 32  # a cyclic sequence: next token = current + 1
    inputs, targets = idx[:, :-1], idx[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        logits = model(inputs)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 32), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.3 * losses[0]
    assert all(p.grad is not None and p.grad.isfinite().all() for p in model.parameters())
