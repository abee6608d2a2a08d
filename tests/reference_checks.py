"""Every encoding and attention variant against its paper and a reference implementation.

``ROWS`` holds one row per ``pos=`` option (``encoding_options()``) and per attention variant
(``ATTENTION_VARIANTS``): the paper, and the checks. A check names its reference (a packaged
implementation, or the paper's equations written out here in float64 where no package has
them), measures the largest difference between nanoattn's output and the reference's on small
seeded inputs (a bias, rotated queries and keys, an attention layer's output, or a model's
logits), and states the tolerance ``test_reference_checks.py`` asserts, with its reason beside it.
``scripts/reference_table.py`` runs every check and publishes ``docs/results/references.md``.

The difference is max |ours - reference| / max(1, |reference|) over the compared entries:
absolute for entries below 1 and relative above, so one float32 tolerance reads the same for a
rotated query of size 1 and a power-kernel bias of size 10^6. float32 rounds every operation
at 2^-24 (6e-8) relative: both sides in float32 with the same operations agree exactly, a few
operations in another order differ by ~1e-7, and a model's logits, after several layers of
64-wide sums and softmaxes, by a few 1e-6.

Where nanoattn and a reference differ by a convention (a layout of the dims, an initialisation,
where a scale is applied), the check converts one into the other and the row's note says how.
Entries of a bias where a key comes after its query are masked by the attention, so only the
visible ones are compared.
"""

from __future__ import annotations

import math
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from hf_support import BASE, GPT2, load_transformers, model, tokens
from rotary_embedding_torch import RotaryEmbedding as TorchRotaryEmbedding
from transformers import (
    DeepseekV3Config,
    Gemma2Config,
    GPT2LMHeadModel,
    GPTNeoXConfig,
    GptOssConfig,
    Llama4ForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MinistralForCausalLM,
    Qwen3ForCausalLM,
    Qwen3NextConfig,
    T5Config,
)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention, Gemma2RotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb as neox_rotation
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_rotation
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding
from transformers.models.t5.modeling_t5 import T5Attention
from variants import at_test_size
from x_transformers.attend import Attend, selective_attn
from x_transformers.x_transformers import (
    AlibiPositionalBias,
    CoPE,
    DataDependentAlibi,
    PolarEmbedding,
    ScaledSinusoidalEmbedding,
    apply_polar_pos_emb,
)
from x_transformers.x_transformers import Attention as XAttention

from nanoattn import GPT, ModelConfig
from nanoattn.config.options import encoding_options
from nanoattn.eval.results import header_lines, provenance, write_page
from nanoattn.eval.tables import format_table
from nanoattn.hf import export_hf
from nanoattn.model import Attention
from nanoattn.model import attention as attention_module
from nanoattn.model.gates import Canon
from nanoattn.model.latent import LatentAttention
from nanoattn.model.selective import SelectiveBias
from nanoattn.positional import alibi_slopes, build_positional


@dataclass(frozen=True)
class Check:
    reference: str  # the package and symbol, or the paper's equations written out here
    compared: str  # which of nanoattn's outputs, on what
    measure: Callable[[], float]  # the largest difference (``difference``)
    tolerance: float  # asserted by test_reference_checks.py; its reason is beside its value below
    note: str = ""  # a convention where nanoattn and the reference differ, and how the check bridges it


@dataclass(frozen=True)
class Row:
    kind: str  # "encoding" or "attention variant"
    paper: str  # authors, year, arXiv id
    checks: tuple[Check, ...]


def difference(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max |ours - reference| / max(1, |reference|), in float64."""
    ours, reference = ours.detach().double(), reference.detach().double()
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    return ((ours - reference).abs() / reference.abs().clamp(min=1)).max().item()


def visible(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """[Tq, Tk]: True where the key is at or before its query."""
    return k_positions[None, :] <= q_positions[:, None]


def interleaved(dim: int) -> list[int]:
    """Dims reordered from the half-split rotary layout (pairs i, i + dim/2) to the interleaved one
    (pairs 2i, 2i + 1): ``x[..., interleaved(dim)]``. The same rotation, the dims permuted."""
    return [i // 2 + (dim // 2 if i % 2 else 0) for i in range(dim)]


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def acts(changed: torch.Tensor, unchanged: torch.Tensor, what: str) -> None:
    """Refuse a vacuous check: the reference must compute something else without ``what``."""
    if (changed - unchanged).abs().max() < 1e-3:
        raise AssertionError(f"{what} does not change the reference's output: the check compares nothing")


# ----------------------------------------------------------------------------- models via export


def exported(fields: dict, expected: type, **load) -> float:
    """A model with every weight perturbed, exported, loaded in transformers (eager attention): the
    logits of both on 80 tokens (2.5x the RoPE models' max_seq_len)."""
    ours = model(**fields)
    idx = tokens()
    with tempfile.TemporaryDirectory() as folder:
        theirs = load_transformers(export_hf(ours, Path(folder) / "hf"), **load)
        if type(theirs) is not expected:
            raise TypeError(f"exported as {type(theirs).__name__}, not {expected.__name__}")
        with torch.no_grad():
            return difference(ours(idx), theirs(idx).logits)


# Logits of float32 models a few layers deep: each 64-wide sum rounds at 2^-24 of its terms'
# size, and the two sides sum in other orders; a few 1e-6 is their noise (test_hf_families' ATOL).
LOGITS = 1e-5


# ----------------------------------------------------------------------------- absolute positions


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


def copy_projections(ours: Attention, theirs, n_kv_head: int, head_dim: int = 16) -> None:
    """Our fused QKV rows and output projection into transformers' q/k/v/o_proj."""
    width = n_kv_head * head_dim
    q_w, k_w, v_w = ours.qkv.weight.split([ours.qkv.weight.shape[0] - 2 * width, width, width])
    pairs = ((theirs.q_proj, q_w), (theirs.k_proj, k_w), (theirs.v_proj, v_w),
             (theirs.o_proj, ours.proj.weight))
    with torch.no_grad():
        for proj, w in pairs:
            proj.weight.copy_(w)


def causal_mask(T: int) -> torch.Tensor:
    return torch.full((T, T), float("-inf")).triu(1)[None, None]  # [1, 1, T, T], as eager attention adds it


def sinks_gpt_oss() -> float:
    """transformers' GptOssAttention (eager), MHA, GQA and MQA, sinks from a small share of the mass
    to most of it: the layer's output and its attention weights."""
    worst, T = 0.0, 24
    for n_kv_head in (4, 2, 1):
        torch.manual_seed(0)
        ours_cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=n_kv_head, max_seq_len=T, attn_sinks=True)
        ours = Attention(ours_cfg).eval()
        hf_cfg = GptOssConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_head,
                              head_dim=16, attention_bias=False, num_hidden_layers=1,
                              layer_types=["full_attention"], max_position_embeddings=T,
                              rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        hf_cfg._attn_implementation = "eager"
        theirs = GptOssAttention(hf_cfg, layer_idx=0).eval()
        with torch.no_grad():
            ours.sinks.copy_(torch.tensor([-1.0, 0.5, 2.0, 4.0]))
            theirs.sinks.copy_(ours.sinks)
            copy_projections(ours, theirs, n_kv_head)
            x, positions = torch.randn(2, T, 64), torch.arange(T)
            cos_sin = GptOssRotaryEmbedding(hf_cfg)(x, positions[None])
            expected, their_weights = theirs(x, position_embeddings=cos_sin, attention_mask=causal_mask(T))
            got, weights = ours(x, build_positional(ours_cfg), positions, T, return_weights=True)
        worst = max(worst, difference(got, expected), difference(weights, their_weights))
    return worst


def softcap_gemma2() -> float:
    """transformers' Gemma2Attention (eager) with attn_logit_softcapping = 1.5 and weights x4, so the
    scores are several units and the cap acts; MHA, GQA and MQA."""
    worst, cap, T = 0.0, 1.5, 24
    for n_kv_head in (4, 2, 1):
        torch.manual_seed(0)
        ours_cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=n_kv_head, max_seq_len=T, attn_softcap=cap)
        ours = Attention(ours_cfg).eval()
        hf_cfg = Gemma2Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_head,
                              head_dim=16, query_pre_attn_scalar=16, attn_logit_softcapping=cap,
                              attention_bias=False, num_hidden_layers=1, layer_types=["full_attention"],
                              max_position_embeddings=T)
        hf_cfg._attn_implementation = "eager"
        theirs = Gemma2Attention(hf_cfg, layer_idx=0).eval()
        with torch.no_grad():
            ours.qkv.weight.mul_(4)
        copy_projections(ours, theirs, n_kv_head)
        with torch.no_grad():
            x, positions = torch.randn(2, T, 64), torch.arange(T)
            cos_sin = Gemma2RotaryEmbedding(hf_cfg)(x, positions[None])
            expected = theirs(x, position_embeddings=cos_sin, attention_mask=causal_mask(T))[0]
            got = ours(x, build_positional(ours_cfg), positions, T)[0]
        worst = max(worst, difference(got, expected))
    return worst


def mla_deepseek() -> float:
    """transformers' DeepseekV3Attention (eager; the attention of DeepSeek-V2's section 2.1), with
    full-rank and low-rank queries, norm gains moved off 1: the output (both paths) and the weights."""
    worst, T, rank, rope = 0.0, 40, 16, 8
    names = {"kv_a.weight": "kv_a_proj_with_mqa.weight", "kv_norm.weight": "kv_a_layernorm.weight",
             "kv_b.weight": "kv_b_proj.weight", "proj.weight": "o_proj.weight",
             "q_proj.weight": "q_proj.weight", "q_a.weight": "q_a_proj.weight",
             "q_norm.weight": "q_a_layernorm.weight", "q_b.weight": "q_b_proj.weight"}
    for q_rank in (None, 24):
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=4, max_seq_len=T, norm_eps=1e-6, mla_kv_rank=rank,
                          mla_q_rank=q_rank, mla_rope_dim=rope)
        ours = LatentAttention(cfg).eval()
        with torch.no_grad():  # norm gains off 1, so a swapped norm cannot hide
            for name, p in ours.named_parameters():
                if "norm" in name:
                    p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(3)) * 0.2)
        hf_cfg = DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4,
                                  q_lora_rank=q_rank, kv_lora_rank=rank, qk_rope_head_dim=rope,
                                  qk_nope_head_dim=16, v_head_dim=16, rope_interleave=False,
                                  attention_bias=False, num_hidden_layers=1, max_position_embeddings=T)
        hf_cfg._attn_implementation = "eager"
        theirs = DeepseekV3Attention(hf_cfg, layer_idx=0).eval()
        theirs.load_state_dict({names[key]: value for key, value in ours.state_dict().items()}, strict=True)
        x, positions = torch.randn(2, T, 64), torch.arange(T)
        with torch.no_grad():
            cos_sin = DeepseekV3RotaryEmbedding(hf_cfg)(x, positions[None])
            expected, their_weights = theirs(x, position_embeddings=cos_sin, attention_mask=causal_mask(T))
            got, weights = ours(x, build_positional(cfg), positions, T, return_weights=True)
            fast, _ = ours(x, build_positional(cfg), positions, T)
        worst = max(worst, difference(got, expected), difference(fast, expected),
                    difference(weights, their_weights))
    return worst


@torch.no_grad()
def differential_paper(attn: Attention, x: torch.Tensor, layer: int) -> torch.Tensor:
    """Ye et al. 2024, section 2.1, written out per head in float64 without positions: for head i,
    [Q1; Q2] and [K1; K2] are query and key heads 2i, 2i + 1, V the value heads 2i, 2i + 1 side by
    side; (softmax(Q1 K1^T / sqrt(d)) - lambda softmax(Q2 K2^T / sqrt(d))) V, then
    (1 - lambda_init) RMSNorm(head), the heads concatenated and projected by W_O."""
    x, H, D = x.double(), attn.n_head, attn.head_dim
    q_w, k_w, v_w = attn.qkv.weight.double().split([H * D, H * D, H * D])
    lam = (math.exp(float(attn.lambda_q1 @ attn.lambda_k1)) - math.exp(float(attn.lambda_q2 @ attn.lambda_k2))
           + 0.8 - 0.6 * math.exp(-0.3 * layer))
    T = x.shape[1]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    heads = []
    for i in range(H // 2):
        maps = []
        for sub in (2 * i, 2 * i + 1):
            q, k = x @ q_w[sub * D:(sub + 1) * D].T, x @ k_w[sub * D:(sub + 1) * D].T  # [B, T, D]
            scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(future, -math.inf)
            maps.append(torch.softmax(scores, dim=-1))
        values = x @ v_w[2 * i * D:(2 * i + 2) * D].T  # [B, T, 2D]
        head = (maps[0] - lam * maps[1]) @ values
        rms = head.pow(2).mean(-1, keepdim=True).add(attn.head_norm.eps).sqrt()
        head = head / rms * attn.head_norm.weight.double()
        heads.append((1 - (0.8 - 0.6 * math.exp(-0.3 * layer))) * head)
    return torch.cat(heads, dim=-1) @ attn.proj.weight.double().T


def diff_paper() -> float:
    """The first layer (lambda_init 0.2) and the fourth, the head norm's gains moved off 1."""
    worst = 0.0
    for layer in (0, 3):
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=64, n_layer=4, n_head=4, n_kv_head=4, pos="nope", diff_attn=True)
        attn = Attention(cfg, layer).eval()
        with torch.no_grad():
            attn.head_norm.weight.add_(torch.randn(32) * 0.2)
            x = torch.randn(2, 12, 64)
            got = attn(x, build_positional(cfg), torch.arange(12), 12)[0]
        worst = max(worst, difference(got, differential_paper(attn, x, layer)))
    return worst


def qk_norm_after_written_out() -> float:
    """Per head: rotate (half-split, float64 angles), then RMSNorm with the q or k gain, then causal
    softmax(q.k / sqrt(d)) v over the K/V heads repeated per group, and W_O; float64, GQA."""
    torch.manual_seed(0)
    T, H, Hkv, D = 20, 4, 2, 16
    cfg = ModelConfig(d_model=64, n_head=H, n_kv_head=Hkv, **at_test_size("qk_norm_after"))
    attn = Attention(cfg).eval()
    with torch.no_grad():
        for p in attn.qk_norm.parameters():
            p.add_(torch.randn(p.shape) * 0.3)
        x = torch.randn(2, T, 64)
        got = attn(x, build_positional(cfg), torch.arange(T), T)[0]
        q_w, k_w, v_w = attn.qkv.weight.double().split([H * D, Hkv * D, Hkv * D])
        heads = lambda w: (x.double() @ w.T).view(2, T, -1, D).transpose(1, 2)  # noqa: E731  [B, h, T, D]
        angle = torch.arange(T, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(D // 2) / (D // 2))
        cos, sin = torch.cos(angle), torch.sin(angle)  # [T, D / 2]

        def rotate_then_norm(h, gain):
            a, b = h[..., :D // 2], h[..., D // 2:]
            h = torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)
            return h / h.pow(2).mean(-1, keepdim=True).add(cfg.norm_eps).sqrt() * gain.double()

        q = rotate_then_norm(heads(q_w), attn.qk_norm.q.weight)
        k = rotate_then_norm(heads(k_w), attn.qk_norm.k.weight).repeat_interleave(H // Hkv, dim=1)
        v = heads(v_w).repeat_interleave(H // Hkv, dim=1)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = (q @ k.transpose(-2, -1) / math.sqrt(D)).masked_fill(future, -math.inf)
        y = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(2, T, H * D)
        expected = y @ attn.proj.weight.double().T
    return difference(got, expected)


def selective_x_transformers() -> float:
    """F (as the bias it subtracts) from head 0's logits of 4 heads over 24 tokens, the logits drawn so
    that F reaches several units: x-transformers' selective_attn on the causally masked logits."""
    T = 24
    pos = build_positional(ModelConfig(d_model=64, n_head=4, pos="nope"))
    q, k = randn(1, 4, T, 16) * 1.5, randn(1, 4, T, 16, seed=1) * 1.5
    positions = torch.arange(T)
    ours = SelectiveBias.start(pos, q, k, lambda s: s, None, 0).bias(q, k, positions, positions, 0)
    sim = (q @ k.transpose(-2, -1) / 4).masked_fill(~visible(positions, positions), -torch.finfo(q.dtype).max)
    theirs = selective_attn(sim) - sim  # -F, the same for every head
    seen = visible(positions, positions)
    acts(theirs[..., seen], torch.zeros_like(theirs[..., seen]), "the selection")
    return difference(ours.expand(1, 4, T, T)[..., seen], theirs[..., seen])


def selective_paper() -> float:
    """An attention layer, GQA, 20 tokens, ALiBi: L_h = q.k / sqrt(d) + bias_h; S_kj = max(0, L_0[k, j])
    for 0 < j < k, else 0; F_ij = sum_{k < i} S_kj; softmax_{j <= i}(L_h[i, j] - F_ij) v, W_O; float64."""
    torch.manual_seed(0)
    T, H, Hkv, D = 20, 4, 2, 16
    cfg = ModelConfig(d_model=64, n_head=H, n_kv_head=Hkv, pos="alibi", **at_test_size("selective"))
    attn, pos = Attention(cfg).eval(), build_positional(cfg)
    with torch.no_grad():
        attn.qkv.weight.mul_(3)  # head 0's logits of order 1: F masks keys
        x = torch.randn(2, T, 64)
        got = attn(x, pos, torch.arange(T), T)[0]
        q_w, k_w, v_w = attn.qkv.weight.double().split([H * D, Hkv * D, Hkv * D])
        heads = lambda w: (x.double() @ w.T).view(2, T, -1, D).transpose(1, 2)  # noqa: E731  [B, h, T, D]
        q = heads(q_w)
        k, v = (heads(w).repeat_interleave(H // Hkv, dim=1) for w in (k_w, v_w))
        t = torch.arange(T)
        bias = pos.bias(None, None, t, t, 0).double()  # [H, T, T]
        logits = q @ k.transpose(-2, -1) / math.sqrt(D) + bias  # [B, H, T, T]
        earlier = (t[None, :] < t[:, None]) & (t[None, :] > 0)  # [T, T]
        s = logits[:, 0].relu() * earlier  # [B, T, T]
        f = torch.stack([s[:, :i].sum(1) for i in range(T)], dim=1)  # F_ij = sum_{k < i} S_kj
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        y = torch.softmax((logits - f[:, None]).masked_fill(future, -math.inf), dim=-1) @ v
        expected = y.transpose(1, 2).reshape(2, T, H * D) @ attn.proj.weight.double().T
        plain = torch.softmax(logits.masked_fill(future, -math.inf), dim=-1) @ v
        acts(y, plain, "F")
    return difference(got, expected)


# An attention layer in float32 against float32 or float64: 64-wide projections, 16-wide scores,
# a softmax over up to 40 keys, the output projection; values of size ~1, each step a few 2^-24.
LAYER = 1e-5


# ----------------------------------------------------------------------------- around the softmax
# The output gate, Scalable-Softmax and exclusive self-attention (model/gates.py), stick-breaking and
# sigmoid attention and FoX's forget gate (model/score_functions.py), each on one layer.

TOKENS = 12


def layer(n_kv_head: int = 4, **fields) -> tuple[Attention, ModelConfig]:
    """One attention layer (d_model 32, 4 heads of 8, max_seq_len 12), NoPE unless ``fields`` name an
    encoding, every parameter drawn N(0, 0.3) so that scores and gates spread over several units."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, max_seq_len=TOKENS,
                      **{"pos": "nope", **fields})
    attn = Attention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return attn, cfg


@torch.no_grad()
def heads64(attn: Attention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v [B, n_head, T, head_dim] in float64 from the fused QKV weight, without positions, each
    K/V head repeated for its group (query head h reads K/V head h // (n_head / n_kv_head))."""
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    B, T, _ = x.shape
    q, k, v = (x.double() @ attn.qkv.weight.double().T).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in (q, k, v))
    return q, k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)


def project(attn: Attention, heads: torch.Tensor) -> torch.Tensor:
    """Heads [B, H, T, D] in float64 concatenated and multiplied by W_O -> [B, T, d_model]."""
    B, H, T, D = heads.shape
    return heads.transpose(1, 2).reshape(B, T, H * D) @ attn.proj.weight.double().T


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    """Softmax of scores [..., T, T] over the keys at or before each query."""
    T = scores.shape[-1]
    return torch.softmax(scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), -math.inf), dim=-1)


def alibi_bias(pos: str) -> torch.Tensor | None:
    """ALiBi's bias [4 heads, T, T], -slope_h (i - j), written out; None for NoPE."""
    i = torch.arange(TOKENS)
    slopes = torch.tensor(alibi_slopes(4))[:, None, None]
    return None if pos == "nope" else -slopes * (i[:, None] - i[None, :])


def against_layer(attn: Attention, cfg: ModelConfig, x: torch.Tensor, expected: torch.Tensor,
                  expected_weights: torch.Tensor) -> float:
    """The layer's output on x [B, T, d_model] through the fast path (queries in chunks of 5, where
    scores are built) and the slow path, and the slow path's weights, against the reference's."""
    B, T, _ = x.shape
    pe, positions = build_positional(cfg), torch.arange(T)
    with torch.no_grad(), mock.patch.object(attention_module, "MASK_CHUNK_ELEMENTS", B * cfg.n_head * 5 * T):
        fast = attn(x, pe, positions, T)[0]
        slow, weights = attn(x, pe, positions, T, return_weights=True)
    return max(difference(fast, expected), difference(slow, expected), difference(weights, expected_weights))


def gate_paper() -> float:
    """Qiu et al. 2025, G1: Y' = Y * sigmoid(X W_theta), X the attention's input, Y the SDPA output,
    one score per head (headwise) or per channel (elementwise); MHA, GQA and MQA."""
    worst = 0.0
    for mode in ("headwise", "elementwise"):
        for n_kv_head in (4, 2, 1):
            attn, cfg = layer(n_kv_head, attn_gate=mode)
            x = randn(2, TOKENS, 32, seed=1)
            q, k, v = heads64(attn, x)
            maps = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim))  # [B, H, T, T]
            with torch.no_grad():
                scores = torch.sigmoid(x.double() @ attn.output_gate.proj.weight.double().T)  # [B, T, 4 | 32]
            gate = scores.view(2, TOKENS, 4, -1).transpose(1, 2)  # [B, H, T, 1 | D]
            worst = max(worst, against_layer(attn, cfg, x, project(attn, (maps @ v) * gate), maps))
    return worst


def gate_qwen3_next() -> float:
    """transformers' Qwen3NextAttention (eager), which computes the elementwise gate with QK-norm
    before RoPE, 24 tokens; MHA, GQA and MQA, the norm gains moved off 1."""
    worst, T = 0.0, 24
    for n_kv_head in (4, 2, 1):
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=n_kv_head, max_seq_len=T, qk_norm="before_rope",
                          attn_gate="elementwise", norm_eps=1e-6)
        ours = Attention(cfg).eval()
        hf = Qwen3NextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_head,
                             head_dim=16, num_hidden_layers=1, layer_types=["full_attention"],
                             max_position_embeddings=T, rms_norm_eps=1e-6,
                             rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                              "partial_rotary_factor": 1.0})
        hf._attn_implementation = "eager"
        theirs = Qwen3NextAttention(hf, layer_idx=0).eval()
        q, k, v = ours.qkv.weight.split([64, 16 * n_kv_head, 16 * n_kv_head])
        gate = ours.output_gate.proj.weight
        with torch.no_grad():
            for norm in (ours.qk_norm.q, ours.qk_norm.k):
                norm.weight.add_(torch.randn(16) * 0.3)  # gains off 1, so the convention shows
            theirs.q_proj.weight.copy_(torch.cat([w[16 * h:16 * (h + 1)] for h in range(4)
                                                  for w in (q, gate)]))  # [q_h | g_h], h = 0, 1, ...
            theirs.k_proj.weight.copy_(k)
            theirs.v_proj.weight.copy_(v)
            theirs.o_proj.weight.copy_(ours.proj.weight)
            theirs.q_norm.weight.copy_(ours.qk_norm.q.weight - 1)
            theirs.k_norm.weight.copy_(ours.qk_norm.k.weight - 1)
            x, positions = torch.randn(2, T, 64), torch.arange(T)
            cos_sin = Qwen3NextRotaryEmbedding(hf)(x, positions[None])
            expected = theirs(x, position_embeddings=cos_sin, attention_mask=causal_mask(T))[0]
            got = ours(x, build_positional(cfg), positions, T)[0]
        worst = max(worst, difference(got, expected))
    return worst


def heads_in_order(w: torch.Tensor, rows: int, order: list[int]) -> torch.Tensor:
    """A weight's blocks of ``rows`` rows per head, head order[0] first."""
    return torch.cat([w[rows * h:rows * (h + 1)] for h in order])


def gate_x_transformers() -> float:
    """x-transformers' ``Attention(gate_values=True)`` (``gate_values_headwise`` for one gate per
    head), 12 tokens; MHA, GQA and MQA."""
    worst, H = 0.0, 4
    for mode in ("headwise", "elementwise"):
        for n_kv_head in (4, 2, 1):
            torch.manual_seed(0)
            group = H // n_kv_head
            cfg = ModelConfig(d_model=64, n_head=H, n_kv_head=n_kv_head, pos="nope", attn_gate=mode)
            ours = Attention(cfg).eval()
            theirs = XAttention(dim=64, dim_head=16, heads=H, kv_heads=n_kv_head, causal=True,
                                gate_values=True, gate_values_headwise=mode == "headwise").eval()
            order = [(i % n_kv_head) * group + i // n_kv_head for i in range(H)]  # their head i: our order[i]
            q, k, v = ours.qkv.weight.split([64, 16 * n_kv_head, 16 * n_kv_head])
            gate_rows = 1 if mode == "headwise" else 16
            with torch.no_grad():
                theirs.to_q.weight.copy_(heads_in_order(q, 16, order))
                theirs.to_k.weight.copy_(k)
                theirs.to_v.weight.copy_(v)
                theirs.to_v_gate.weight.copy_(heads_in_order(ours.output_gate.proj.weight, gate_rows, order))
                theirs.to_out.weight.copy_(heads_in_order(ours.proj.weight.T, 16, order).T)
                x = torch.randn(2, TOKENS, 64)
                got = ours(x, build_positional(cfg), torch.arange(TOKENS), TOKENS)[0]
                worst = max(worst, difference(got, theirs(x)))
    return worst


def ssmax_paper() -> float:
    """Nakanishi 2025, eq. (2): z_i -> n^(s z_i) / sum_j n^(s z_j), z the query's logits q.k / sqrt(d),
    n the number of keys it sees (i + 1, at most the window), s per head; MHA, GQA and MQA, with and
    without a window of 5."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        for window in (None, 5):
            attn, cfg = layer(n_kv_head, ssmax=True, sliding_window=window)
            with torch.no_grad():
                attn.ssmax.s.copy_(torch.tensor([0.2, 0.5, 1.0, 2.0]))
            x = randn(2, TOKENS, 32, seed=1)
            q, k, v = heads64(attn, x)
            z = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)  # [B, H, T, T]
            s = attn.ssmax.s.detach().double().view(1, 4, 1)
            maps = torch.zeros_like(z)
            for i in range(TOKENS):
                first = 0 if window is None else max(0, i - window + 1)
                powers = (i + 1 - first) ** (s * z[:, :, i, first:i + 1])  # [B, H, n]
                maps[:, :, i, first:i + 1] = powers / powers.sum(-1, keepdim=True)
            worst = max(worst, against_layer(attn, cfg, x, project(attn, maps @ v), maps))
    return worst


def xsa_paper() -> float:
    """Zhai 2026: z_i = y_i - (y_i . v_i / |v_i|^2) v_i per head, v_i the token's value in the head's
    K/V group, the maps those of plain attention; MHA, GQA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        attn, cfg = layer(n_kv_head, xsa=True)
        x = randn(2, TOKENS, 32, seed=1)
        q, k, v = heads64(attn, x)
        maps = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim))
        y = maps @ v  # [B, H, T, D]
        z = y - (y * v).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True) * v
        if (z * v).sum(-1).abs().max() > 1e-12:
            raise AssertionError("the written-out exclusion is not orthogonal to the token's value")
        expected = project(attn, z)
        acts(expected, project(attn, y), "the exclusion")
        worst = max(worst, against_layer(attn, cfg, x, expected, maps))
    return worst


# One layer with every weight drawn N(0, 0.3) (``layer``): scores q.k / sqrt(d) up to ~20 and outputs
# up to ~12, each output a 32-wide sum of W_O's products of several units, so an entry below 1 carries
# a few 2^-24 of its terms' size, a few 1e-6 absolute: twice LAYER.
SPREAD_LAYER = 2e-5

@torch.no_grad()
def score_loops(attn: Attention, x: torch.Tensor, weigh: Callable, bias: torch.Tensor | None = None):
    """Loops over batch, head and query in float64: s_ij = q_i.k_j / sqrt(d) (+ bias[h, i, j]), the
    query's row of weights ``weigh(s_i, b, h, i)`` (a list over the keys), each head's sum_j a_ij v_j,
    the heads concatenated and projected by W_O. -> (output [B, T, d_model], weights [B, H, T, T])."""
    q, k, v = heads64(attn, x)
    B, H, T, D = q.shape
    bias = torch.zeros(H, T, T) if bias is None else bias
    weights = torch.zeros(B, H, T, T, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for i in range(T):
                s = [float(q[b, h, i] @ k[b, h, j]) / math.sqrt(D) + float(bias[h, i, j]) for j in range(T)]
                weights[b, h, i] = torch.tensor(weigh(s, b, h, i), dtype=torch.float64)
    return project(attn, weights @ v), weights


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def stick_breaking_row(window: int | None):
    """Tan et al. 2025: over the keys j < i (within the window: i - j < window),
    A_ij = beta_ij * prod_{j<k<i} (1 - beta_ik), beta = sigma(s)."""
    def weigh(s, b, h, i):
        keys = [j for j in range(i) if window is None or i - j < window]
        return [sigmoid(s[j]) * math.prod(1 - sigmoid(s[k]) for k in keys if k > j) if j in keys else 0.0
                for j in range(len(s))]
    return weigh


def sigmoid_row(n: int):
    """Ramapuram et al. 2024: A_ij = sigma(s_ij - log n) over the keys j <= i."""
    return lambda s, b, h, i: [sigmoid(s[j] - math.log(n)) if j <= i else 0.0 for j in range(len(s))]


def forget_gate_row(log_f: torch.Tensor):
    """Lin et al. 2025: softmax over the keys j <= i of s_ij + sum_{t=j+1..i} log f_t, with log f
    [B, T, H] of each batch row, token and head."""
    def weigh(s, b, h, i):
        logits = [s[j] + sum(float(log_f[b, t, h]) for t in range(j + 1, i + 1)) for j in range(i + 1)]
        top = max(logits)
        e = [math.exp(z - top) for z in logits]
        return [e[j] / sum(e) if j <= i else 0.0 for j in range(len(s))]
    return weigh


def head_rms(x: torch.Tensor, weight: torch.Tensor, heads: int, eps: float) -> torch.Tensor:
    """RMSNorm of each head of x [B, T, heads * dh] over its channels, a gain per channel: FoX's
    GroupNorm with one group a head."""
    grouped = x.view(*x.shape[:-1], heads, -1)
    return (grouped * torch.rsqrt(grouped.square().mean(-1, keepdim=True) + eps)).reshape(x.shape) * weight


def fox_shift(raw: torch.Tensor, alpha: torch.Tensor, heads: int) -> torch.Tensor:
    """FoX's ShiftLinear: k_t = alpha_t k~_{t-1} + (1 - alpha_t) k~_t per head, k~_{-1} = 0."""
    grouped = raw.view(*raw.shape[:-1], heads, -1)
    previous = F.pad(grouped, (0, 0, 0, 0, 1, 0))[:, :-1]
    return (alpha[..., None] * previous + (1 - alpha[..., None]) * grouped).reshape(raw.shape)


def fox_pro_paper() -> float:
    """The Pro block of Lin et al.'s code (ForgettingAttentionLayer with the output gate, output norm,
    QK-norm and key/value shift on, no RoPE, QK-norm gains shared across heads as their released runs),
    written out from the layer's weights in float64 on its normalised input; MHA, as the authors'."""
    attn, cfg = layer(4, **at_test_size("fox_pro"))
    x = randn(2, TOKENS, 32, seed=1)
    w = {name: p.detach().double() for name, p in attn.named_parameters()}
    H, D, eps = 4, 32, cfg.norm_eps
    xd = x.double()
    q, k, v = F.linear(xd, w["qkv.weight"]).split(D, dim=-1)
    a = torch.sigmoid(F.linear(xd, w["kv_shift.proj.weight"]))  # [B, T, 2H]: the keys' a, then the values'
    k, v = fox_shift(k, a[..., :H], H), fox_shift(v, a[..., H:], H)
    q = head_rms(q, w["qk_norm.q.weight"].repeat(H), H, eps)
    k = head_rms(k, w["qk_norm.k.weight"].repeat(H), H, eps)
    log_f = F.logsigmoid(F.linear(xd, w["forget_gate.proj.weight"], w["forget_gate.proj.bias"]))
    c = log_f.cumsum(1).transpose(1, 2)  # [B, H, T]
    q, k, v = (t.view(2, TOKENS, H, -1).transpose(1, 2) for t in (q, k, v))
    s = q @ k.transpose(-1, -2) / math.sqrt(D // H) + c[..., :, None] - c[..., None, :]
    o = (causal_softmax(s) @ v).transpose(1, 2).reshape(2, TOKENS, D)
    gate = torch.sigmoid(F.linear(xd, w["output_gate.proj.weight"]))
    expected = F.linear(head_rms(o, w["output_norm.weight"], H, eps) * gate, w["proj.weight"])
    with torch.no_grad():
        ours = attn(x, build_positional(cfg).for_layer(0), torch.arange(TOKENS), TOKENS)[0]
        unshifted = Attention(ModelConfig(**{**cfg.to_dict(), "kv_shift": False})).eval()
        unshifted.load_state_dict({n: p for n, p in attn.state_dict().items() if "kv_shift" not in n})
        acts(ours, unshifted(x, build_positional(cfg).for_layer(0), torch.arange(TOKENS), TOKENS)[0],
             "the key/value shift")
    return float((ours.double() - expected).abs().max())


def stick_breaking_paper() -> float:
    """NoPE, ALiBi and a window of 5; MHA, GQA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        for pos, window in (("nope", None), ("alibi", None), ("nope", 5)):
            attn, cfg = layer(n_kv_head, attn_fn="stick_breaking", pos=pos, sliding_window=window)
            x = randn(2, TOKENS, 32, seed=1)
            expected, weights = score_loops(attn, x, stick_breaking_row(window), alibi_bias(pos))
            worst = max(worst, against_layer(attn, cfg, x, expected, weights))
    return worst


def sigmoid_paper() -> float:
    """NoPE and ALiBi; MHA, GQA and MQA; n = max_seq_len = the inputs' 12 tokens."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        for pos in ("nope", "alibi"):
            attn, cfg = layer(n_kv_head, attn_fn="sigmoid", pos=pos)
            x = randn(2, TOKENS, 32, seed=1)
            expected, weights = score_loops(attn, x, sigmoid_row(cfg.max_seq_len), alibi_bias(pos))
            worst = max(worst, against_layer(attn, cfg, x, expected, weights))
    return worst


def fox_paper() -> float:
    """log f_t = log sigma(w_h . x_t + b_h) from the gate's weights; NoPE and ALiBi; MHA, GQA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        for pos in ("nope", "alibi"):
            attn, cfg = layer(n_kv_head, forget_gate=True, pos=pos)
            x = randn(2, TOKENS, 32, seed=1)
            gate = attn.forget_gate.proj
            with torch.no_grad():
                log_f = F.logsigmoid(x.double() @ gate.weight.double().T + gate.bias.double())  # [B, T, H]
            if log_f.std() < 0.2:
                raise AssertionError("the gates barely differ between tokens and heads: the check is weak")
            expected, weights = score_loops(attn, x, forget_gate_row(log_f), alibi_bias(pos))
            worst = max(worst, against_layer(attn, cfg, x, expected, weights))
    return worst


def projected(attn: Attention, x: torch.Tensor):
    """q [B, H, T, D], k, v [B, Hkv, T, D] as the layer makes them (NoPE), in float32."""
    B, T, _ = x.shape
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    return attn.qkv(x).view(B, T, H + 2 * Hkv, D).transpose(1, 2).split([H, Hkv, Hkv], dim=1)


def sigmoid_x_transformers() -> float:
    """x-transformers' ``Attend(sigmoid=True)`` on the layer's q, k, v; MHA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 1):
        attn, cfg = layer(n_kv_head, attn_fn="sigmoid")
        x, positions = randn(2, TOKENS, 32, seed=1), torch.arange(TOKENS)
        with torch.no_grad():
            q, k, v = projected(attn, x)
            got = attn._attend(q, k, v, positions, positions, build_positional(cfg), 0)  # [B, H, T, D]
            b = torch.full((TOKENS, TOKENS), -math.log(cfg.max_seq_len))
            theirs = Attend(causal=True, sigmoid=True)(q, k, v, attn_bias=b)[0]
        worst = max(worst, difference(got, theirs))
    return worst


def fox_x_transformers() -> float:
    """x-transformers' ``DataDependentAlibi`` (FoX's decay as a bias) with the layer's gate weights,
    fed to its softmax ``Attend`` on the layer's q, k, v, then W_O; MHA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 1):
        attn, cfg = layer(n_kv_head, forget_gate=True)
        dda = DataDependentAlibi(32, 4)
        x = randn(2, TOKENS, 32, seed=1)
        with torch.no_grad():
            dda.to_forget_gates[0].weight.copy_(attn.forget_gate.proj.weight)
            dda.to_forget_gates[0].bias.copy_(attn.forget_gate.proj.bias)
            got = attn(x, build_positional(cfg), torch.arange(TOKENS), TOKENS)[0]
            q, k, v = projected(attn, x)
            y = Attend(causal=True)(q, k, v, attn_bias=dda(x))[0]  # [B, H, T, D]
            theirs = attn.proj(y.transpose(1, 2).reshape(2, TOKENS, 32))
        worst = max(worst, difference(got, theirs))
    return worst


# ----------------------------------------------------------------------------- the residual stream


def value_embeds_written_out() -> float:
    """The plain model with a hook rewriting the value slice of each fed layer's QKV projection to
    a v + b E[token]: the same weights must give the same logits."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=4, n_head=4, n_kv_head=2, max_seq_len=16,
                  qk_norm="before_rope")
    embedded = GPT(ModelConfig(**fields, value_embeds=1)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    plain.load_state_dict(embedded.state_dict(), strict=False)
    with torch.no_grad():
        embedded.blocks[0].attn.value_mix.copy_(torch.tensor([0.7, 1.3]))
        embedded.blocks[3].attn.value_mix.copy_(torch.tensor([-0.4, 2.0]))
        embedded.value_emb[0].weight.normal_()  # rows as large as the values, so the mix shows
    idx = torch.randint(0, 40, (2, 16))

    def mixing(block):
        a, b = block.attn.value_mix.tolist()

        def hook(module, inputs, out):
            q_k, v = out.split([32 + 16, 16], dim=-1)
            return torch.cat([q_k, a * v + b * embedded.value_emb[0](idx)], dim=-1)
        return hook

    with torch.no_grad():
        unhooked = plain(idx)
        for i in (0, 3):
            plain.blocks[i].attn.qkv.register_forward_hook(mixing(embedded.blocks[i]))
        expected = plain(idx)
        acts(expected, unhooked, "the value embeddings")
        return difference(embedded(idx), expected)


def token_shift_written_out() -> float:
    """The plain model with a hook on its token table rewriting each row e_t to e_t + g e_{t-1}
    (e_{-1} = 0): the same weights must give the same logits."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16, pos="learned")
    shifted = GPT(ModelConfig(**fields, token_shift=True)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    plain.load_state_dict(shifted.state_dict(), strict=False)
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        shifted.shift_gate.normal_()
        gate = shifted.shift_gate.clone()
        unhooked = plain(idx)
        plain.tok_emb.register_forward_hook(
            lambda module, inputs, e: e + gate * torch.nn.functional.pad(e[:, :-1], (0, 0, 1, 0)))
        expected = plain(idx)
        acts(expected, unhooked, "the token shift")
        return difference(shifted(idx), expected)


DIGITS = list(range(10))  # the digits' token ids; tokens drawn from 0-13, so most runs are several long


def abacus_indices(row: list[int], k: int) -> list[int]:
    """McLeish et al. 2024: each digit's index within its number, 1 at the number's first written digit,
    plus the offset k; 0 for every other token."""
    indices, run = [], 0
    for token in row:
        run = run + 1 if token in DIGITS else 0
        indices.append(run + k if run else 0)
    return indices


def abacus_written_out(name: str) -> float:
    """Option ``name``'s model with its abacus table drawn N(0, 1), and the model of its ``pos`` without
    the abacus (the same weights) with a hook rewriting each token's embedding to E[token] + A[i]: the
    logits at evaluation (k = 0), and in training over 3 forward passes, each row against the k in
    [0, abacus_max_offset] whose logits are nearest (the paper's one offset for every index of a row)."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=24,
                  abacus_max_offset=4, abacus_digits=DIGITS, **encoding_options()[name])
    abacus = GPT(ModelConfig(**fields))
    plain = GPT(ModelConfig(**{**fields, "abacus": False}))
    plain.load_state_dict(abacus.state_dict(), strict=False)
    idx = torch.randint(0, 14, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        abacus.abacus.table.weight.normal_()  # rows far apart, so an index off by one shows
        table = abacus.abacus.table.weight.clone()

    def logits(k: int, training: bool) -> torch.Tensor:
        index = torch.tensor([abacus_indices(row, k) for row in idx.tolist()])
        hook = plain.tok_emb.register_forward_hook(lambda module, inputs, e: e + table[index])
        try:
            return plain.train(training)(idx)
        finally:
            hook.remove()

    with torch.no_grad():
        expected = logits(0, training=False)
        acts(expected, plain.eval()(idx), "the abacus")
        worst, offsets = difference(abacus.eval()(idx), expected), set()
        candidates = [logits(k, training=True) for k in range(fields["abacus_max_offset"] + 1)]
        for seed in range(3):
            torch.manual_seed(seed)
            ours = abacus.train()(idx)
            for b in range(len(idx)):
                nearest, k = min((difference(ours[b], c[b]), k) for k, c in enumerate(candidates))
                worst, offsets = max(worst, nearest), offsets | {k}
        if offsets == {0}:
            raise AssertionError("every offset drawn in training was 0: the check compares no offset")
    return worst


def physicslm4_convolution(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """PhysicsLM4's canon layer (its ShortConvolution without the CUDA kernel) with taps ``weight``
    [d_model, width] on x [B, T, d_model]: a depthwise ``nn.Conv1d`` padded by width - 1 on both
    sides, cut to its first T outputs, plus the input."""
    D, width = weight.shape
    conv = torch.nn.Conv1d(D, D, width, groups=D, padding=width - 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(weight[:, None, :])
        return x + conv(x.transpose(1, 2))[..., :x.shape[1]].transpose(1, 2)


def canon_physicslm4() -> float:
    """The layer alone, widths 2 and 4, its taps as drawn."""
    worst = 0.0
    for width in (2, 4):
        torch.manual_seed(0)
        canon = Canon(ModelConfig(d_model=16, canon=width), layer=0)
        x = randn(2, TOKENS, 16)
        with torch.no_grad():
            worst = max(worst, difference(canon(x), physicslm4_convolution(canon.weight, x)))
    return worst


def canon_written_out() -> float:
    """The plain model with that convolution hooked onto each attention's input (the block's
    normalised input), taps from the canon model (width 3): the same weights must give the same logits."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    canon = GPT(ModelConfig(**fields, canon=3)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    plain.load_state_dict(canon.state_dict(), strict=False)
    idx = torch.randint(0, 40, (2, 16))

    def convolved(weight):
        def hook(module, args, kwargs):
            return (physicslm4_convolution(weight, args[0]), *args[1:]), kwargs
        return hook

    with torch.no_grad():
        unhooked = plain(idx)
        for block, ours in zip(plain.blocks, canon.blocks, strict=True):
            block.attn.register_forward_pre_hook(convolved(ours.canon.weight), with_kwargs=True)
        expected = plain(idx)
        acts(expected, unhooked, "the canon layers")
        return difference(canon(idx), expected)


# The layer's shifted sums against conv1d's, width products of values below 3 summed in another
# order: a few 2^-24.
CONVOLUTION = 1e-6

# The same float32 operations on both sides except where the hook computes a v + b e, e + g e' or
# E + A (one product and one sum, possibly fused differently): a few 2^-24 carried through the layers.
HOOKED = 1e-6


# ----------------------------------------------------------------------------- the rows

ENCODING, VARIANT = "encoding", "attention variant"
WRITTEN_OUT = "the paper's equations, written out in float64 in tests/reference_checks.py"
LLAMA_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
IROPE = {**BASE, **encoding_options()["irope"], "temperature_floor_scale": 8}  # acting from position 7 on
LLAMA_LOGITS = "logits of the exported model (4 layers, GQA, 80 tokens)"


def variant_fields(name: str) -> dict:
    return {**BASE, **at_test_size(name)}


POSITIONS = "positions 0-31 and 5000-5031"
P_ROPE = {"rope_type": "proportional", "rope_theta": 10000.0,
          "partial_rotary_factor": encoding_options()["p_rope"]["rope_p"]}
NOT_PACKAGED = "the authors' code ({}) is not packaged"
ABACUS_PAPER = "McLeish et al. 2024, arXiv:2405.17399"


def abacus_checks(name: str) -> tuple[Check, ...]:
    """The three forms differ only in the ``pos`` beside the abacus: one check, over each form's model."""
    pos = encoding_options()[name]["pos"]
    return (Check(f"the model with pos={pos} and no abacus, its embeddings rewritten to E[token] + A[i] by a "
                  "hook, i each digit's index in its number (+ k in training) written out from the paper",
                  "logits (2 layers, 24 tokens in runs of digits), at evaluation and in training (3 "
                  "forward passes, each drawing k)", lambda: abacus_written_out(name), HOOKED,
                  NOT_PACKAGED.format("mcleish7/arithmetic, abacus.py") + "; x-transformers has none. "
                  "nanoattn draws one offset k per forward pass for the whole batch, as that code: the check "
                  "finds each row's k, the one in [0, abacus_max_offset] whose written-out logits are "
                  "nearest"),)

ROWS: dict[str, Row] = {
    "sinusoidal": Row(ENCODING, "Vaswani et al. 2017, arXiv:1706.03762", (
        Check(WRITTEN_OUT, "the first block's input, sqrt(d_model) E[token] + PE(pos)", sinusoidal_paper,
              SINUSOID),)),
    "sinusoidal_scaled": Row(ENCODING, "Hua et al. 2022, arXiv:2202.10447 (learned scale)", (
        Check("x_transformers.ScaledSinusoidalEmbedding", "embeddings + amplitude x table, 64 positions",
              sinusoidal_scaled_x_transformers, SCALED_SINUSOID,
              "x-transformers puts the sines first and the cosines after them, nanoattn interleaves them as "
              "the paper: compared under that permutation of the table's columns. The amplitude is copied "
              "(nanoattn starts it at 0, x-transformers at d^-1/2)"),)),
    "learned": Row(ENCODING, "Radford et al. 2019 (GPT-2; no arXiv id)", (
        Check("transformers.GPT2LMHeadModel", "logits of the exported model (2 layers, 80 tokens)",
              lambda: exported(GPT2, GPT2LMHeadModel), LOGITS,
              "nanoattn starts the table at 0, transformers' GPT-2 at N(0, 0.02): compared on perturbed "
              "weights"),)),
    "rope": Row(ENCODING, "Su et al. 2021, arXiv:2104.09864", (
        Check("transformers LlamaRotaryEmbedding + apply_rotary_pos_emb",
              f"rotated q, k (GQA) at {POSITIONS}",
              lambda: rope_against_llama("rope", LLAMA_ROPE), ROTATION),
        Check("rotary_embedding_torch.RotaryEmbedding", f"rotated q at {POSITIONS}",
              rope_rotary_embedding_torch, ROTATION,
              "rotary-embedding-torch rotates interleaved pairs (2i, 2i+1), nanoattn half-split pairs "
              "(i, i+d/2) as Llama: compared under that permutation of the head's dims"))),
    "alibi": Row(ENCODING, "Press et al. 2022, arXiv:2108.12409", (
        Check("x_transformers.AlibiPositionalBias", "bias, 12 heads x 40 x 40", alibi_x_transformers,
              BIAS),)),
    "nope": Row(ENCODING, "Kazemnejad et al. 2023, arXiv:2305.19466", (
        Check("transformers.Llama4ForCausalLM, every layer without RoPE", LLAMA_LOGITS,
              lambda: exported({**BASE, **encoding_options()["nope"]}, Llama4ForCausalLM), LOGITS),)),
    "t5": Row(ENCODING, "Raffel et al. 2020, arXiv:1910.10683", (
        Check("transformers T5Attention.compute_bias (decoder)", "bias at 5 (buckets, max distance) pairs, "
              "distances 0 to 3 max_distance and 123,456", t5_transformers, BIAS),)),
    "kerple_log": Row(ENCODING, "Chi et al. 2022, arXiv:2205.09921", (
        Check(WRITTEN_OUT, "bias, 4 heads, distances 0 to 1000", lambda: kerple_paper("kerple_log"), BIAS,
              NOT_PACKAGED.format("chijames/KERPLE")),)),
    "kerple_power": Row(ENCODING, "Chi et al. 2022, arXiv:2205.09921", (
        Check(WRITTEN_OUT, "bias, 4 heads, distances 0 to 1000", lambda: kerple_paper("kerple_power"),
              KERPLE, NOT_PACKAGED.format("chijames/KERPLE")),)),
    "fire": Row(ENCODING, "Li et al. 2023, arXiv:2310.04418", (
        Check(WRITTEN_OUT, "bias, 4 heads, queries 0-39, 500 and 1000", fire_paper, FIRE,
              "as the reference module circulated with the paper: |c|, L = |s| L0, 1e-6 added to the "
              "normaliser"),)),
    "cope": Row(ENCODING, "Golovneva et al. 2024, arXiv:2405.18719", (
        Check("x_transformers.CoPE", "bias, 4 query heads over 2 key heads, 24 tokens, clipped at 7",
              cope_x_transformers, COPE,
              "x-transformers (the paper's appendix code) adds the position logits to q.k / sqrt(d); the "
              "authors' released code (facebookresearch/RAM), as nanoattn, adds them to q.k before dividing "
              "by sqrt(d): compared with q / sqrt(d) handed to x-transformers' position logits"),)),
    "xpos": Row(ENCODING, "Sun et al. 2022, arXiv:2212.10554", (
        Check("rotary_embedding_torch.RotaryEmbedding(use_xpos=True)", "rotated and decayed q, k, 64 tokens",
              xpos_rotary_embedding_torch, XPOS,
              "interleaved pairs there, half-split here (dims permuted); both centre positions on "
              "max_seq_len // 2, which the reference takes from the current length: compared at that "
              "length"),)),
    "pope": Row(ENCODING, "Gopalakrishnan et al. 2025, arXiv:2509.10534", (
        Check("x_transformers PolarEmbedding + apply_polar_pos_emb", f"q.k logits of mapped q, k (MHA) at "
              f"{POSITIONS}; with the phase bias at 0-31", pope_x_transformers, POPE,
              "x-transformers adds the phase bias to the keys' phase; nanoattn turns the queries by minus it "
              "(the same score, one bias per query head under GQA) and multiplies them by sqrt(2) against "
              "attention's 1/sqrt(2d): compared as logits. Its bias is shared by the layers, nanoattn's per "
              "layer; both start at 0 within [-2 pi, 0]"),
        Check(WRITTEN_OUT, "attention layer output, GQA, 20 tokens, phase bias drawn in its range",
              pope_paper, LAYER))),
    "rope_partial": Row(ENCODING, "Black et al. 2022 (GPT-NeoX-20B), arXiv:2204.06745", (
        Check("transformers GPTNeoXRotaryEmbedding + apply_rotary_pos_emb (rotary_pct 0.25)",
              f"rotated q, k at {POSITIONS}", rope_partial_gpt_neox, ROTATION),)),
    "p_rope": Row(ENCODING, "Barbero et al. 2024, arXiv:2410.06205", (
        Check("transformers LlamaRotaryEmbedding, rope_type 'proportional'",
              f"rotated q, k (GQA) at {POSITIONS}",
              lambda: rope_against_llama("p_rope", P_ROPE), ROTATION),)),
    "abacus": Row(ENCODING, ABACUS_PAPER, abacus_checks("abacus")),
    "abacus_fire": Row(ENCODING, f"{ABACUS_PAPER}; FIRE: Li et al. 2023, arXiv:2310.04418",
                       abacus_checks("abacus_fire")),
    "abacus_rope": Row(ENCODING, f"{ABACUS_PAPER}; RoPE: Su et al. 2021, arXiv:2104.09864",
                       abacus_checks("abacus_rope")),
    "irope": Row(ENCODING, "Meta 2025 (Llama 4; no paper); temperature: Nakanishi 2025, arXiv:2501.19399", (
        Check("transformers.Llama4ForCausalLM", LLAMA_LOGITS, lambda: exported(IROPE, Llama4ForCausalLM),
              LOGITS, "temperature_floor_scale 8 instead of the option's 128 (the labs' training length), so "
              "the temperature acts within the 80 tokens"),)),
    "plain": Row(VARIANT, "Vaswani et al. 2017, arXiv:1706.03762", (
        Check("transformers.LlamaForCausalLM", LLAMA_LOGITS,
              lambda: exported(variant_fields("plain"), LlamaForCausalLM), LOGITS),)),
    "qk_norm": Row(VARIANT, "Yang et al. 2025 (Qwen 3), arXiv:2505.09388", (
        Check("transformers.Qwen3ForCausalLM", LLAMA_LOGITS,
              lambda: exported(variant_fields("qk_norm"), Qwen3ForCausalLM), LOGITS,
              "per head, as Qwen 3; OLMo 2 (arXiv:2501.00656) normalises the whole projection instead"),)),
    "qk_norm_after": Row(VARIANT, "Karpathy 2025 (nanochat; no paper)", (
        Check(WRITTEN_OUT, "attention layer output, GQA, 20 tokens", qk_norm_after_written_out, LAYER,
              "nanochat's norm has no gain; nanoattn's gains start at 1 and learn (compared with gains "
              "moved off 1)"),)),
    "softcap": Row(VARIANT, "Gemma Team 2024 (Gemma 2), arXiv:2408.00118", (
        Check("transformers Gemma2Attention (eager)", "attention layer output, MHA, GQA and MQA, cap 1.5",
              softcap_gemma2, LAYER,
              "the output-logit cap is cap tanh(logits / cap), checked against that formula in "
              "tests/model/test_attention_variants.py"),)),
    "sinks": Row(VARIANT, "OpenAI 2025 (gpt-oss model card), arXiv:2508.10925", (
        Check("transformers GptOssAttention (eager)", "attention layer output and weights, MHA, GQA and MQA",
              sinks_gpt_oss, LAYER,
              "nanoattn starts the sinks at 0, transformers at N(0, 0.02): compared with sinks -1 to 4"),)),
    "window": Row(VARIANT, "Jiang et al. 2023 (Mistral 7B), arXiv:2310.06825", (
        Check("transformers.MinistralForCausalLM", LLAMA_LOGITS + ", window 6",
              lambda: exported(variant_fields("window"), MinistralForCausalLM), LOGITS),)),
    "local_global": Row(VARIANT, "Gemma Team 2024 (Gemma 2), arXiv:2408.00118", (
        Check("transformers.MinistralForCausalLM", LLAMA_LOGITS + ", windows 6 and none alternating",
              lambda: exported(variant_fields("local_global"), MinistralForCausalLM), LOGITS),)),
    "diff": Row(VARIANT, "Ye et al. 2024, arXiv:2410.05258", (
        Check(WRITTEN_OUT, "attention layer output, layers 1 and 4", diff_paper, LAYER,
              NOT_PACKAGED.format("microsoft/unilm, Diff-Transformer")),)),
    "mla": Row(VARIANT, "DeepSeek-AI 2024 (DeepSeek-V2), arXiv:2405.04434", (
        Check("transformers DeepseekV3Attention (eager)",
              "attention layer output and weights, full- and low-rank queries", mla_deepseek, LAYER),)),
    "value_embeds": Row(VARIANT, "Jordan et al. 2024 (modded-nanogpt; no paper)", (
        Check("the plain model with its values rewritten to a v + b E[token] by a hook", "logits",
              value_embeds_written_out, HOOKED),)),
    "token_shift": Row(VARIANT, "Peng et al. 2023 (RWKV), arXiv:2305.13048; modded-nanogpt's smear", (
        Check("the plain model with its embeddings rewritten to e_t + g e_(t-1) by a hook", "logits",
              token_shift_written_out, HOOKED),)),
    "gate": Row(VARIANT, "Qiu et al. 2025, arXiv:2505.06708 (G1; Qwen3-Next)", (
        Check(WRITTEN_OUT, "attention layer output and weights, headwise and elementwise, MHA, GQA and MQA",
              gate_paper, SPREAD_LAYER),
        Check("transformers Qwen3NextAttention (eager)",
              "attention layer output, elementwise, with QK-norm, MHA, GQA and MQA", gate_qwen3_next, LAYER,
              "Qwen3-Next's q_proj holds each head's query rows then its gate rows, nanoattn's gate is a "
              "projection of its own: its rows copied into that order. Qwen3-Next stores its norm gains as "
              "1 + w: compared with nanoattn's gains moved off 1, copied as gain - 1"),
        Check("x_transformers.Attention(gate_values=True)",
              "attention layer output, headwise and elementwise, MHA, GQA and MQA", gate_x_transformers,
              LAYER, "x-transformers starts W_g at 0 (every gate 1/2): compared with nanoattn's W_g copied. "
              "Its query head i reads K/V head i mod n_kv_head, nanoattn's i // (n_head / n_kv_head): "
              "compared with nanoattn's heads permuted into its order (queries, gates and W_O's columns)"))),
    "ssmax": Row(VARIANT, "Nakanishi 2025, arXiv:2501.19399", (
        Check(WRITTEN_OUT, "attention layer output and weights, MHA, GQA and MQA, with and without a "
              "window of 5", ssmax_paper, SPREAD_LAYER,
              "the paper learns s from a start it leaves open, nanoattn starts it at 1 / log max_seq_len: "
              "compared with s from 0.2 to 2 per head"),)),
    "xsa": Row(VARIANT, "Zhai 2026, arXiv:2603.09078", (
        Check(WRITTEN_OUT, "attention layer output and weights, MHA, GQA and MQA", xsa_paper,
              SPREAD_LAYER),)),
    "canon": Row(VARIANT, "Allen-Zhu 2025 (Physics of Language Models 4.1, Canon-A), arXiv:2512.17351", (
        Check("the authors' convolution (a depthwise torch.nn.Conv1d padded by width - 1, cut to T, plus "
              "the input), written out in tests/reference_checks.py", "the canon layer's output, widths 2 "
              "and 4", canon_physicslm4, CONVOLUTION,
              NOT_PACKAGED.format("facebookresearch/PhysicsLM4")),
        Check("the plain model with that convolution hooked onto each attention's input", "logits",
              canon_written_out, HOOKED))),
    "fox": Row(VARIANT, "Lin et al. 2025 (Forgetting Transformer), arXiv:2503.02130", (
        Check(WRITTEN_OUT, "attention layer output and weights, NoPE and ALiBi, MHA, GQA and MQA", fox_paper,
              SPREAD_LAYER),
        Check("x_transformers.DataDependentAlibi, fed to its Attend", "attention layer output, MHA and MQA",
              fox_x_transformers, SPREAD_LAYER,
              "x-transformers starts the gate's bias at 5 (gates near 1), FoX and nanoattn at 0: compared "
              "with nanoattn's gate weights and bias copied. Its query head h reads K/V head h mod "
              "n_kv_head, nanoattn's h // (n_head / n_kv_head): compared at MHA and MQA, where both agree"))),
    "fox_pro": Row(VARIANT, "Lin et al. 2025 (Forgetting Transformer, the Pro block), arXiv:2503.02130", (
        Check("the Pro layer of the authors' code (zhixuan-lin/forgetting-transformer), in float64",
              "attention layer output, MHA, the gate, norms and shift away from their starts", fox_pro_paper,
              SPREAD_LAYER, "the authors' code is not packaged; their MLP at 3.5 d_model is left out"),)),
    "stick_breaking": Row(VARIANT, "Tan et al. 2025, arXiv:2410.17980", (
        Check(WRITTEN_OUT, "attention layer output and weights, NoPE, ALiBi and a window of 5, MHA, GQA "
              "and MQA", stick_breaking_paper, SPREAD_LAYER,
              NOT_PACKAGED.format("shawntan/stickbreaking-attention, a Triton kernel")),)),
    "sigmoid": Row(VARIANT, "Ramapuram et al. 2024, arXiv:2409.04431", (
        Check(WRITTEN_OUT, "attention layer output and weights, NoPE and ALiBi, MHA, GQA and MQA",
              sigmoid_paper, SPREAD_LAYER,
              "the paper's b = -log n takes n as the sequence length, nanoattn as max_seq_len: compared at "
              "inputs of max_seq_len tokens, where both are 12"),
        Check("x_transformers.Attend(sigmoid=True)", "each head's output, MHA and MQA",
              sigmoid_x_transformers, SPREAD_LAYER,
              "x-transformers adds no b of its own: b = -log n given as its attn_bias. Its query head h "
              "reads K/V head h mod n_kv_head, nanoattn's h // (n_head / n_kv_head): compared at MHA and "
              "MQA, where both agree"))),
    "selective": Row(VARIANT, "Leviathan et al. 2024, arXiv:2410.02703", (
        Check("x_transformers.attend.selective_attn", "the bias -F, 4 heads, 24 tokens",
              selective_x_transformers, BIAS,
              "x-transformers recomputes every step (no cache: with cached keys it would zero another column "
              "than the first token's and never mask the cached keys); nanoattn caches F's column sums"),
        Check(WRITTEN_OUT, "attention layer output, GQA, ALiBi, 20 tokens", selective_paper, LAYER,
              "S from the logits the softmax sees, the encoding's bias included"))),
}


# ----------------------------------------------------------------------------- the published table

PAGE = "references"
FOLDER = Path(__file__).resolve().parents[1] / "docs" / "results"
ABOUT = ("Every positional encoding (`pos=`) and attention variant (`attention=`) of nanoattn against its "
         "paper: the reference implementation it is tested against, what is compared, and the largest "
         "difference measured, max |nanoattn - reference| / max(1, |reference|) over the compared entries "
         "(absolute below 1, relative above), on small seeded inputs in float32 on nanoattn's side. The "
         "tolerance is the one `tests/test_reference_checks.py` asserts; the checks, and the reason for each "
         "tolerance, are in `tests/reference_checks.py`. A note says where nanoattn and the reference differ "
         "by a convention, and how the check bridges it.")
COLUMNS = ("name", "kind", "paper", "reference", "compared", "largest difference", "tolerance", "note")


def measured() -> list[dict[str, Any]]:
    """Every check run once: one row per (option, reference)."""
    return [{"name": name, "kind": row.kind, "paper": row.paper, "reference": check.reference,
             "compared": check.compared, "difference": check.measure(), "tolerance": check.tolerance,
             "note": check.note}
            for name, row in ROWS.items() for check in row.checks]


def number(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


def render(page: Mapping[str, Any]) -> str:
    """The markdown page of a record: its header, then one table row per check."""
    def text(cell: str) -> str:
        return cell.replace("|", "\\|")  # a bar inside a cell would end it

    rows = ([f"`{r['name']}`", r["kind"], text(r["paper"]), text(r["reference"]), text(r["compared"]),
             number(r["difference"]) + ("" if r["difference"] <= r["tolerance"] else " (over the tolerance)"),
             number(r["tolerance"]), text(r["note"])] for r in page["rows"])
    table = format_table(COLUMNS, rows, "lllllrrl")
    return "\n".join([*header_lines(page), "", table.rstrip("\n")]) + "\n"


def publish(folder: str | Path = FOLDER) -> Path:
    """Run every check and write ``<folder>/references.{json,md}``; the markdown's path."""
    page = {**provenance(PAGE, "Reference implementations", ABOUT), "rows": measured()}
    return write_page(folder, page, render=render)
