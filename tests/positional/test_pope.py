"""PoPE (Gopalakrishnan et al. 2025): the paper's score written out in float64, x-transformers'
PolarEmbedding on the same numbers, and what PoPE shares with RoPE (scalings, the KV cache).

Cached decoding (MHA, GQA, MQA, past the training length), the chunked path, head analysis and the
export refusal are the generic tests over the registry (test_generate.py, test_attention.py,
test_heads.py, test_hf_families.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from x_transformers.x_transformers import PolarEmbedding, apply_polar_pos_emb

from nanoattn import GPT, KVCache, ModelConfig
from nanoattn.model import Attention
from nanoattn.positional import build_positional
from nanoattn.positional.pope import PHASE_BIAS_RANGE, PolarLayer
from nanoattn.train.optim import param_groups
from nanoattn.train.step import project_parameters

D = 8  # head_dim in these tests


def config(**fields) -> ModelConfig:
    base = dict(vocab_size=32, d_model=4 * D, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16, pos="pope")
    return ModelConfig(**{**base, **fields})


def with_phase_bias(layer: PolarLayer, seed: int = 0) -> PolarLayer:
    with torch.no_grad():
        layer.phase_bias.uniform_(*PHASE_BIAS_RANGE, generator=torch.Generator().manual_seed(seed))
    return layer


def polar_score(q: list[float], k: list[float], t: int, s: int, delta: list[float], theta: float) -> float:
    """The paper's score of query q at position t and key k at s, one head, float64 loops:
    sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_c) / sqrt(d), theta_c = theta^(-c/d)."""
    d = len(q)
    total = 0.0
    for c in range(d):
        softplus_q, softplus_k = math.log1p(math.exp(q[c])), math.log1p(math.exp(k[c]))
        total += softplus_q * softplus_k * math.cos((s - t) * theta ** (-c / d) + delta[c])
    return total / math.sqrt(d)


def layer_scores(layer: PolarLayer, q: torch.Tensor, k: torch.Tensor, t: torch.Tensor, s: torch.Tensor,
                 seq_len: int) -> torch.Tensor:
    """What attention computes from PoPE's map: q [B, H, Tq, d] at t over k [B, H, Tk, d] at s (MHA)."""
    q2 = layer.scale_queries(layer.rotate(q, t, seq_len), t)  # [B, H, Tq, 2d]
    k2 = layer.scale_keys(layer.rotate(k, s, seq_len), s)
    return q2 @ k2.transpose(-2, -1) / math.sqrt(q2.shape[-1])  # attention's 1 / sqrt(width)


@pytest.mark.parametrize("phase_bias", [False, True])
def test_the_score_is_the_papers_polar_form(phase_bias):
    cfg = config(n_kv_head=4, pope_phase_bias=phase_bias)
    layer = build_positional(cfg).for_layer(1)
    if phase_bias:
        with_phase_bias(layer)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 3, D, generator=g) * 2, torch.randn(1, 4, 5, D, generator=g) * 2
    t, s = torch.tensor([4, 40, 1000]), torch.tensor([0, 3, 4, 39, 999])  # far past max_seq_len too
    got = layer_scores(layer, q, k, t, s, 1001)
    delta = layer.phase_bias.detach().view(4, D) if phase_bias else torch.zeros(4, D)
    for h in range(4):
        for i in range(3):
            for j in range(5):
                expected = polar_score(q[0, h, i].tolist(), k[0, h, j].tolist(), int(t[i]), int(s[j]),
                                       delta[h].tolist(), cfg.rope_theta)
                # float32 phases at position 1,000: about 1e-4 rad off, on products of order 10
                assert got[0, h, i, j].item() == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_the_content_never_moves_the_phase():
    """RoPE's what-where entanglement is gone: the score is largest at distance 0 for any content
    when delta = 0 (every term softplus * softplus * cos((s - t) theta_c) peaks there)."""
    layer = build_positional(config(pope_phase_bias=False)).for_layer(0)
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(1, 1, 1, D, generator=g) * 3, torch.randn(1, 1, 1, D, generator=g) * 3
    scores = torch.cat([layer_scores(layer, q, k, torch.tensor([50]), torch.tensor([s]), 51)[0, 0, 0]
                        for s in range(51)])
    assert scores.argmax().item() == 50


def test_pope_matches_x_transformers_polar_embedding():
    """x-transformers (2.x): inv_freq = base^(-c/d), softplus magnitudes, [mu cos | mu sin], its learned
    bias added to the keys' phase and clamped to [-2 pi, 0], logits scaled by dim_head^-0.5. Ours turns
    the queries by -delta and multiplies them by sqrt(2) against attention's 1 / sqrt(2d): with MHA
    and the same delta the same logits."""
    cfg = config(n_kv_head=4)
    layer = with_phase_bias(build_positional(cfg).for_layer(0))
    theirs = PolarEmbedding(D, 4)
    with torch.no_grad():
        theirs.learned_bias.copy_(layer.phase_bias.view(4, 1, D))  # [heads, 1, dim]
    g = torch.Generator().manual_seed(2)
    q, k = torch.randn(2, 4, 12, D, generator=g), torch.randn(2, 4, 12, D, generator=g)
    positions = torch.arange(12)
    freqs, bias = theirs(positions)
    keys = apply_polar_pos_emb(k, freqs + bias)
    expected = apply_polar_pos_emb(q, freqs) @ keys.transpose(-2, -1) * D ** -0.5
    torch.testing.assert_close(layer_scores(layer, q, k, positions, positions, 12), expected,
                               atol=1e-5, rtol=1e-5)


def test_with_gqa_each_query_head_keeps_its_own_phase_bias():
    cfg = config(n_kv_head=1)
    layer = with_phase_bias(build_positional(cfg).for_layer(0))
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 6, D, generator=g), torch.randn(1, 1, 6, D, generator=g)
    positions = torch.arange(6)
    got = layer_scores(layer, q, k.expand(1, 4, 6, D), positions, positions, 6)
    for h in range(4):  # head h alone against the paper's form with its own delta
        expected = polar_score(q[0, h, 5].tolist(), k[0, 0, 2].tolist(), 5, 2,
                               layer.phase_bias.view(4, D)[h].tolist(), cfg.rope_theta)
        assert got[0, h, 5, 2].item() == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_each_layer_has_its_own_phase_bias_kept_in_range_and_learned_from_zero():
    model = GPT(config(pos=["pope", "nope"], n_layer=4))
    pe = model.pos
    pope = [pe.for_layer(i) for i in (0, 2)]
    assert pope[0] is not pope[1] and all(isinstance(p, PolarLayer) for p in pope)
    assert [name for name, _ in model.named_parameters() if "phase_bias" in name] == [
        "pos.encodings.pope.by_layer.0.phase_bias", "pos.encodings.pope.by_layer.1.phase_bias"]
    assert all(torch.equal(p.phase_bias, torch.zeros(4 * D)) for p in pope)  # PoPE without the bias
    _, keep = param_groups(model, 0.1)
    assert {id(p.phase_bias) for p in pope} <= {id(p) for p in keep["params"]}  # an angle: not decayed
    idx = torch.randint(0, 32, (2, 12), generator=torch.Generator().manual_seed(4))
    model.loss(idx[:, :-1], idx[:, 1:]).backward()
    assert all(p.phase_bias.grad.abs().sum() > 0 for p in pope)
    with torch.no_grad():
        pope[0].phase_bias.fill_(1.0)
        pope[1].phase_bias.fill_(-7.0)
    project_parameters(model)
    assert torch.equal(pope[0].phase_bias, torch.zeros(4 * D))
    assert torch.equal(pope[1].phase_bias, torch.full((4 * D,), -2 * math.pi))


def test_the_phase_bias_is_optional():
    assert not [n for n, _ in GPT(config(pope_phase_bias=False)).named_parameters() if n.startswith("pos.")]


def test_the_frequencies_are_ropes_at_twice_the_width_and_every_scaling_applies():
    """d frequencies theta^(-c/d) are RoPE's theta^(-2i/2d): a linear scaling of 2 puts position 2m
    where m was, YaRN's attention factor multiplies both magnitudes (the logits by its square)."""
    plain = build_positional(config(pope_phase_bias=False)).for_layer(0)
    inv_freq, _ = plain.frequencies()
    torch.testing.assert_close(inv_freq, 10000.0 ** (-torch.arange(D, dtype=torch.float64) / D).float())
    x = torch.randn(1, 2, 1, D, generator=torch.Generator().manual_seed(5))
    linear = build_positional(config(pope_phase_bias=False, rope_scaling={"type": "linear", "factor": 2.0}))
    torch.testing.assert_close(linear.for_layer(0).rotate(x, torch.tensor([14]), 15),
                               plain.rotate(x, torch.tensor([7]), 8))
    yarn = build_positional(config(pope_phase_bias=False, rope_scaling={"type": "yarn", "factor": 4.0}))
    frequencies, factor = yarn.for_layer(0).frequencies()
    assert factor > 1
    magnitude = yarn.for_layer(0).rotate(x, torch.tensor([0]), 1)[..., :D]  # phase 0: cos = factor
    torch.testing.assert_close(magnitude, torch.nn.functional.softplus(x) * factor)


def test_the_kv_cache_holds_keys_in_polar_form():
    """2 x head_dim numbers a key head (the real and imaginary parts), values head_dim: 3/2 of RoPE's
    cache; a StreamingLLM cache keeps keys before the map, head_dim wide."""
    cfg = config()
    cache = KVCache(cfg, 2, 10)
    assert [k.shape for k in cache.k] == [(2, 2, 10, 2 * D)] * 2 and [v.shape[-1] for v in cache.v] == [D, D]
    rope = KVCache(config(pos="rope"), 2, 10)
    assert 2 * cache.bytes_per_token() == 3 * rope.bytes_per_token()
    mixed = KVCache(config(pos=["pope", "nope"]), 2, 10)
    assert [k.shape[-1] for k in mixed.k] == [2 * D, D]


def test_attention_with_pope_is_the_papers_attention():
    """One attention layer against the paper written out: q, k, v from the fused projection, scores
    Re[q~^H k~] / sqrt(d) with delta, causal softmax, W_O; GQA (a key head per two query heads)."""
    cfg = config(n_layer=1)
    torch.manual_seed(0)
    attn, pe = Attention(cfg).eval(), build_positional(cfg)
    with_phase_bias(pe.for_layer(0))
    x = torch.randn(1, 6, cfg.d_model)
    with torch.no_grad():
        got, _ = attn(x, pe.for_layer(0), torch.arange(6), 6)
    w = attn.qkv.weight.double()
    heads = (x.double() @ w.T).view(6, 8, D)  # [T, q heads 0-3 | k heads 4-5 | v heads 6-7, D]
    delta = pe.for_layer(0).phase_bias.double().view(4, D)
    out = torch.zeros(6, 4, D, dtype=torch.float64)
    for h in range(4):
        kv = h // 2
        for i in range(6):
            scores = [polar_score(heads[i, h].tolist(), heads[j, 4 + kv].tolist(), i, j, delta[h].tolist(),
                                  cfg.rope_theta) for j in range(i + 1)]
            weights = torch.softmax(torch.tensor(scores, dtype=torch.float64), dim=0)
            out[i, h] = weights @ heads[:i + 1, 6 + kv]
    expected = out.reshape(6, 4 * D) @ attn.proj.weight.double().T
    torch.testing.assert_close(got[0].double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("fields, message", [
    (dict(rope_fraction=0.5), "model.rope_fraction=0.5 is invalid: must be 1 with pos='pope'"),
    (dict(rope_p=0.75), "model.rope_p=0.75 is invalid: must be 1 with pos='pope'"),
    (dict(qk_norm="after_rope"), "model.qk_norm='after_rope' is invalid: cannot act after the rotation "
                                 "with pos='pope': after pope's map a head is 16 numbers, where it takes "
                                 "head_dim=8"),
    (dict(pope_phase_bias=1), "model.pope_phase_bias=1 is invalid: must be true or false"),
])
def test_what_pope_has_no_form_for_is_refused_in_one_line(fields, message):
    with pytest.raises(ValueError, match=f"^{message}") as error:
        config(**fields)
    assert "\n" not in str(error.value)
