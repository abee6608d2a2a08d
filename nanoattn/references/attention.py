"""Reference checks of the attention variants that change the attention layer: sinks, soft-caps,
latent attention, differential attention, QK-norm, selective attention."""

from __future__ import annotations

import math

import torch
from transformers import (
    DeepseekV3Config,
    Gemma2Config,
    GptOssConfig,
)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)
from transformers.models.gemma2.modeling_gemma2 import Gemma2Attention, Gemma2RotaryEmbedding
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding
from x_transformers.attend import selective_attn

from nanoattn import ModelConfig
from nanoattn.model import Attention
from nanoattn.model.latent import LatentAttention
from nanoattn.model.selective import SelectiveBias
from nanoattn.positional import build_positional
from nanoattn.references.core import acts, difference, randn, visible
from nanoattn.references.fixtures import at_test_size


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
            got, expected = rotary_layer_outputs(ours, ours_cfg, theirs, Gemma2RotaryEmbedding(hf_cfg), T)
        worst = max(worst, difference(got, expected))
    return worst


def rotary_layer_outputs(ours: Attention, cfg: ModelConfig, theirs, rotary, T: int):
    """(ours, theirs): both layers' outputs on one random [2, T, 64] input at positions 0..T-1, theirs
    given transformers' cos/sin from ``rotary`` and a causal mask."""
    x, positions = torch.randn(2, T, 64), torch.arange(T)
    expected = theirs(x, position_embeddings=rotary(x, positions[None]), attention_mask=causal_mask(T))[0]
    return ours(x, build_positional(cfg), positions, T)[0], expected


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
# The output gate, Scalable-Softmax and exclusive self-attention (nanoattn/mechanisms), stick-breaking and
# sigmoid attention (mechanisms/score_functions.py) and FoX's forget gate (model/forget_gate.py), each on
# one layer.

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


