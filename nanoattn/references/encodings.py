"""Reference checks of the positional encodings: absolute tables, rotations, biases, CoPE."""

from __future__ import annotations

import math

import torch
from rotary_embedding_torch import RotaryEmbedding as TorchRotaryEmbedding
from transformers import (
    GPTNeoXConfig,
    LlamaConfig,
    T5Config,
)
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_rotation
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotation
from transformers.models.t5.modeling_t5 import T5Attention
from x_transformers.x_transformers import (
    AlibiPositionalBias,
    CoPE,
    PolarEmbedding,
    ScaledSinusoidalEmbedding,
    apply_polar_pos_emb,
)

from nanoattn import GPT, ModelConfig
from nanoattn.config.options import encoding_options
from nanoattn.model import Attention
from nanoattn.positional import build_positional
from nanoattn.references.core import difference, interleaved, randn, visible


def sinusoidal_paper() -> float:
    """The first block's input, sqrt(d_model) E[token] + PE(pos), written out from the paper."""
    d = 16
    torch.manual_seed(0)
    model_ = GPT(ModelConfig(vocab_size=50, d_model=d, n_head=2, n_layer=1, pos="sinusoidal"))
    idx = torch.tensor([[3, 0, 49, 7, 3, 11]])
    seen = {}

    def keep_input(block, args):
        seen["x"] = args[0]  # [B, T, d_model]

    model_.blocks[0].register_forward_pre_hook(keep_input)
    with torch.no_grad():
        model_(idx)
    pe = torch.tensor([[math.sin(p / 10000 ** (i / d)) if i % 2 == 0 else math.cos(p / 10000 ** ((i - 1) / d))
                        for i in range(d)] for p in range(idx.shape[1])], dtype=torch.float64)
    return difference(seen["x"][0], math.sqrt(d) * model_.tok_emb.weight.double()[idx[0]] + pe)


def sinusoidal_scaled_x_transformers() -> float:
    d, T = 16, 64
    ours = build_positional(ModelConfig(d_model=d, n_head=2, pos="sinusoidal_scaled"))
    theirs = ScaledSinusoidalEmbedding(d)
    with torch.no_grad():
        ours.scale.fill_(0.5)  # a trained amplitude: ours starts at 0, theirs at d^-1/2
        theirs.scale.copy_(ours.scale)
    x = randn(2, T, d)
    table = theirs(x)  # [T, d]: [sin | cos]
    # Ours interleaves sin and cos (dims 2i, 2i + 1) as the paper; theirs puts the sines first.
    return difference(ours.embed(x, torch.arange(T)), x + table[:, interleaved(d)])


# float32 against float64: the table's rounding (|PE| <= 1: 2^-24), one rounding of the product
# (|sqrt(d) E| ~ 0.1) and of the sum (|x| < 2): a few 1e-7.
SINUSOID = 1e-6
# Against x-transformers' float32 phase p * inv_freq (up to 63 * 2^-24 = 4e-6 rad off at position 63,
# times the amplitude 0.5), then one product and one sum.
SCALED_SINUSOID = 3e-6


# ----------------------------------------------------------------------------- rotations

ROTATED = torch.cat([torch.arange(32), torch.arange(5000, 5032)])  # near and far positions


def rotated(fields: dict, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor = ROTATED):
    """nanoattn's queries and keys [B, heads, T, D] rotated (and scaled) at positions [T]."""
    pos = build_positional(ModelConfig(**fields))
    seq_len = int(positions.max()) + 1
    return (pos.scale_queries(pos.rotate(q, positions, seq_len), positions),
            pos.scale_keys(pos.rotate(k, positions, seq_len), positions))


def rope_against_llama(name: str, rope_parameters: dict) -> float:
    """Option ``name`` at head_dim 16, GQA, against transformers' Llama rotation with those
    rope_parameters: cos/sin from LlamaRotaryEmbedding, then apply_rotary_pos_emb."""
    q, k = randn(2, 4, len(ROTATED), 16), randn(2, 2, len(ROTATED), 16, seed=1)
    ours = rotated(dict(d_model=64, n_head=4, n_kv_head=2, **encoding_options()[name]), q, k)
    hf = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                     rope_parameters=rope_parameters)
    cos, sin = LlamaRotaryEmbedding(hf)(q, ROTATED[None])
    theirs = llama_rotation(q, k, cos, sin)
    return max(difference(a, b) for a, b in zip(ours, theirs, strict=True))


def rope_rotary_embedding_torch() -> float:
    """rotary-embedding-torch's rotation at offsets 0 and 5000, head_dim 16, its dims interleaved."""
    q = randn(2, 4, 32, 16)
    worst = 0.0
    for offset in (0, 5000):
        positions = torch.arange(offset, offset + 32)
        ours, _ = rotated(dict(d_model=64, n_head=4, pos="rope"), q, q, positions)
        theirs = TorchRotaryEmbedding(16).rotate_queries_or_keys(q[..., interleaved(16)], offset=offset)
        worst = max(worst, difference(ours[..., interleaved(16)], theirs))
    return worst


def rope_partial_gpt_neox() -> float:
    """head_dim 32, a quarter rotating: 8 dims, as GPT-NeoX's rotary_pct = 0.25."""
    q, k = randn(2, 2, len(ROTATED), 32), randn(2, 2, len(ROTATED), 32, seed=1)
    fields = encoding_options()["rope_partial"]
    ours = rotated(dict(d_model=64, n_head=2, **fields), q, k)
    hf = GPTNeoXConfig(hidden_size=64, num_attention_heads=2, rotary_pct=fields["rope_fraction"])
    cos, sin = GPTNeoXRotaryEmbedding(hf)(q, ROTATED[None])
    theirs = neox_rotation(q, k, cos, sin)
    return max(difference(a, b) for a, b in zip(ours, theirs, strict=True))


def xpos_rotary_embedding_torch() -> float:
    """Queries and keys rotated and decayed, T = max_seq_len = 64, so that both centre the
    positions on 32; gamma 32 so the decay is far from 1 (zeta_0^(+-1) at the ends)."""
    T, gamma = 64, 32.0
    q, k = randn(2, 4, T, 16), randn(2, 4, T, 16, seed=1)
    ours = rotated(dict(d_model=64, n_head=4, pos="xpos", max_seq_len=T, xpos_scale_base=gamma),
                   q, k, torch.arange(T))
    order = interleaved(16)
    theirs = TorchRotaryEmbedding(16, use_xpos=True, xpos_scale_base=gamma).rotate_queries_and_keys(
        q[..., order], k[..., order])
    return max(difference(a[..., order], b) for a, b in zip(ours, theirs, strict=True))


def pope_x_transformers() -> float:
    """The logits of PoPE-mapped queries and keys, MHA, head_dim 16: x-transformers' PolarEmbedding +
    apply_polar_pos_emb, scaled by dim_head^-0.5 as its Attend; at positions 0-31 and 5000-5031 without
    the phase bias, and at 0-31 with it drawn in its range (x-transformers adds it to the float32 phase
    s theta, which near position 5,000 rounds the sum by up to 2.4e-4 rad; nanoattn turns by it apart)."""
    D = 16
    worst = 0.0
    for positions, drawn in ((ROTATED, False), (torch.arange(32), True)):
        pos = build_positional(ModelConfig(d_model=4 * D, n_head=4, pos="pope")).for_layer(0)
        theirs = PolarEmbedding(D, 4)
        with torch.no_grad():
            if drawn:
                pos.phase_bias.uniform_(-2 * math.pi, 0.0, generator=torch.Generator().manual_seed(2))
            theirs.learned_bias.copy_(pos.phase_bias.view(4, 1, D))
        q, k = randn(2, 4, len(positions), D), randn(2, 4, len(positions), D, seed=1)
        seq_len = int(positions.max()) + 1
        q2 = pos.scale_queries(pos.rotate(q, positions, seq_len), positions)
        k2 = pos.scale_keys(pos.rotate(k, positions, seq_len), positions)
        ours = q2 @ k2.transpose(-2, -1) / math.sqrt(2 * D)  # attention's 1 / sqrt(width)
        freqs, bias = theirs(positions)
        keys = apply_polar_pos_emb(k, freqs + bias)
        reference = apply_polar_pos_emb(q, freqs) @ keys.transpose(-2, -1) * D ** -0.5
        seen = visible(positions, positions)
        worst = max(worst, difference(ours[..., seen], reference[..., seen]))
    return worst


def pope_paper() -> float:
    """An attention layer, GQA, 20 tokens: sum_c softplus(q_c) softplus(k_c) cos((s - t) theta_c + delta_hc)
    / sqrt(d), theta_c = theta^(-c/d), causal softmax, the K/V heads repeated per group, W_O; float64."""
    torch.manual_seed(0)
    T, H, Hkv, D = 20, 4, 2, 16
    cfg = ModelConfig(d_model=64, n_head=H, n_kv_head=Hkv, pos="pope")
    attn, pos = Attention(cfg).eval(), build_positional(cfg).for_layer(0)
    with torch.no_grad():
        pos.phase_bias.uniform_(-2 * math.pi, 0.0)
        x = torch.randn(2, T, 64)
        got = attn(x, pos, torch.arange(T), T)[0]
        q_w, k_w, v_w = attn.qkv.weight.double().split([H * D, Hkv * D, Hkv * D])
        heads = lambda w: (x.double() @ w.T).view(2, T, -1, D).transpose(1, 2)  # noqa: E731  [B, h, T, D]
        q, k = torch.nn.functional.softplus(heads(q_w)), torch.nn.functional.softplus(heads(k_w))
        k, v = k.repeat_interleave(H // Hkv, dim=1), heads(v_w).repeat_interleave(H // Hkv, dim=1)
        theta = 10000.0 ** (-torch.arange(D, dtype=torch.float64) / D)  # [D]
        t = torch.arange(T, dtype=torch.float64)
        phase = (t[None, :] - t[:, None])[None, :, :, None] * theta + pos.phase_bias.double().view(H, 1, 1, D)
        scores = (q[:, :, :, None, :] * k[:, :, None, :, :] * torch.cos(phase)).sum(-1) / math.sqrt(D)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        y = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1) @ v
        expected = y.transpose(1, 2).reshape(2, T, H * D) @ attn.proj.weight.double().T
    return difference(got, expected)


# One to three float32 roundings of O(1) products and sums on either side, in possibly another
# order (the phase p * inv_freq is the same float32 product on both): a few 2^-24.
ROTATION = 1e-6
# PoPE's logits: 32 products of softplus magnitudes (up to ~4 for unit-normal inputs) and cos or sin,
# summed in another order on each side (and times sqrt(2) on ours), into logits of size ~1: a few
# 2^-24 of the terms' size; the phase is the same float32 product p * inv_freq on both sides.
POPE = 5e-6
# xPos's factor: ours exp((n - c) ln(zeta) / gamma), theirs zeta ** ((n - c) / gamma), each a few
# float32 roundings of an exponent up to |ln(2/7)| = 1.25: relative error within ~5 x 2^-24.
XPOS = 1e-6


# ----------------------------------------------------------------------------- biases


def alibi_x_transformers() -> float:
    """12 heads (not a power of two: the slopes' interleaving rule acts), 40 tokens."""
    positions = torch.arange(40)
    ours = build_positional(ModelConfig(d_model=96, n_head=12, pos="alibi")).bias(None, None, positions,
                                                                                  positions, 0)
    theirs = AlibiPositionalBias(heads=12)(40, 40)  # [12, 40, 40]
    seen = visible(positions, positions)
    return difference(ours[:, seen], theirs[:, seen])


def t5_transformers() -> float:
    """transformers' decoder T5Attention.compute_bias with our table, for every distance up to
    3 max_distance and one far query (distance 123,456), at several (num_buckets, max_distance)."""
    worst = 0.0
    for buckets, max_distance in [(32, 128), (8, 20), (33, 100), (2, 4), (16, 9)]:
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=64, n_head=4, pos="t5", t5_num_buckets=buckets,
                          t5_max_distance=max_distance)
        ours = build_positional(cfg)
        hf = T5Config(d_model=64, num_heads=4, d_kv=16, relative_attention_num_buckets=buckets,
                      relative_attention_max_distance=max_distance, is_decoder=True)
        theirs = T5Attention(hf, has_relative_attention_bias=True)
        with torch.no_grad():
            theirs.relative_attention_bias.weight.copy_(ours.table.weight)  # [num_buckets, n_head]
            T, far = 3 * max_distance, 123_456
            grid = ours.bias(None, None, torch.arange(T), torch.arange(T), 0)  # [H, T, T]
            seen = visible(torch.arange(T), torch.arange(T))
            worst = max(worst, difference(grid[:, seen], theirs.compute_bias(T, T)[0][:, seen]))
            ours_far = ours.bias(None, None, torch.tensor([far]), torch.arange(far + 1), 0)  # [H, 1, far + 1]
            worst = max(worst, difference(ours_far, theirs.compute_bias(1, far + 1, past_seen_tokens=far)[0]))
    return worst


def kerple_paper(name: str) -> float:
    """The paper's kernels, -r1 log(1 + r2 d) and -r1 d^r2, in float64 at chosen (r1, r2) per head
    and distances d from 0 to 1000."""
    r1 = [0.5, 1.0, 1.5, 2.5]
    r2 = {"kerple_log": [0.1, 0.5, 1.0, 3.0], "kerple_power": [0.5, 1.0, 1.5, 2.0]}[name]
    queries, keys = [0, 1, 5, 9, 40, 1000], [0, 1, 2, 4, 9, 39, 999, 1000]
    enc = build_positional(ModelConfig(d_model=32, n_layer=2, n_head=4, pos=name))
    with torch.no_grad():
        enc.r1.copy_(torch.tensor(r1))
        enc.r2.copy_(torch.tensor(r2))
    got = enc.bias(None, None, torch.tensor(queries), torch.tensor(keys), 0)  # [H, Tq, Tk]

    def kernel(h: int, d: int) -> float:
        return -r1[h] * math.log(1 + r2[h] * d) if name == "kerple_log" else -r1[h] * d ** r2[h]

    expected = torch.tensor([[[kernel(h, max(m - n, 0)) for n in keys] for m in queries] for h in range(4)],
                            dtype=torch.float64)
    return difference(got, expected)


def fire_paper() -> float:
    """bias_ij = f(psi(i - j) / psi(max(L, i))), psi(x) = log(|c| x + 1), f: 1 -> width -> heads
    (ReLU), written out in float64 from the layer's parameters, moved off their init; queries
    near and far past L."""
    torch.manual_seed(0)
    enc = build_positional(ModelConfig(d_model=32, n_head=4, pos="fire", max_seq_len=32))
    layer = enc.per_layer[0]
    with torch.no_grad():
        layer.c.fill_(-0.3)  # used as |c|
        layer.L_scale.fill_(1.25)  # L = 1.25 * 8 = 10
    queries, keys = torch.cat([torch.arange(40), torch.tensor([500, 1000])]), torch.arange(1001)
    got = enc.bias(None, None, queries, keys, 0)  # [H, Tq, Tk]
    c, L = 0.3, 1.25 * 8
    i, j = queries.double()[:, None], keys.double()[None, :]
    psi = lambda d: torch.log(c * d + 1)  # noqa: E731
    x = psi((i - j).clamp(min=0)) / (psi(torch.maximum(i, torch.tensor(L))) + 1e-6)  # [Tq, Tk]
    w1, b1 = layer.w1.double()[:, 0, None, None], layer.b1.double()[:, None, None]
    hidden = torch.relu(w1 * x + b1)  # [width, Tq, Tk]
    expected = torch.einsum("hw,wqk->hqk", layer.w2.double(), hidden) + layer.b2.double()[:, None, None]
    seen = visible(queries, keys)
    return difference(got[:, seen], expected[:, seen])


def cope_x_transformers() -> float:
    """x-transformers' CoPE (the paper's appendix code) on the same q, k and table: 4 query heads
    over 2 key heads, 24 tokens, npos_max 8, so positions are clipped."""
    torch.manual_seed(0)
    T, D = 24, 8
    pe = build_positional(ModelConfig(d_model=32, n_head=4, n_kv_head=2, pos="cope", cope_npos_max=8))
    theirs = CoPE(dim=D, heads=4, max_pos=8)
    with torch.no_grad():
        pe.embeddings.normal_()
        theirs.pos_emb.copy_(pe.embeddings[0])  # [npos_max, head_dim]
        q, k = randn(2, 4, T, D), randn(2, 2, T, D, seed=1)
        positions = torch.arange(T)
        ours = pe.bias(q, k, positions, positions, 0)  # [B, H, T, T]
        seen = visible(positions, positions)
        scores = (q @ k.repeat_interleave(2, dim=1).transpose(-2, -1) / math.sqrt(D)).masked_fill(
            ~seen, -torch.finfo(torch.float32).max)  # masked as x-transformers masks before CoPE
        reference = theirs(q / math.sqrt(D), scores)
    return difference(ours[..., seen], reference[..., seen])


# A bias from integer distances in a few float32 operations (a product, a log or an exp, a gather):
# a few 2^-24 relative; KERPLE's power kernel exp(r2 log d) carries its exponent's absolute error
# (up to 3 roundings of r2 log d < 14, < 3e-6) as a relative one.
BIAS = 1e-6
KERPLE = 1e-5
# FIRE: the normalised distance is a ratio of two float32 logs (a few 2^-24 relative, on inputs in
# [0, 1]), then a 1 -> 32 -> 4 MLP with weights below 1: sums of 32 such terms.
FIRE = 1e-5
# CoPE: gates from 8-wide dot products, a reverse cumulative sum of up to 24 of them (positions up
# to 7 exactly clipped), and interpolation between two 8-wide dot products of unit-normal vectors.
COPE = 1e-5


# ----------------------------------------------------------------------------- attention layers
