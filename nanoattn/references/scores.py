"""Reference checks of gates, score scalings and score functions (SSMax, XSA, sigmoid, stick-breaking,
the forget gate and FoX Pro), against the papers' equations written out or x-transformers."""

from __future__ import annotations

import math
from collections.abc import Callable
from unittest import mock

import torch
import torch.nn.functional as F
from transformers import (
    Qwen3NextConfig,
)
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding
from x_transformers.attend import Attend
from x_transformers.x_transformers import Attention as XAttention
from x_transformers.x_transformers import (
    DataDependentAlibi,
)

from nanoattn import ModelConfig
from nanoattn.model import Attention, routes
from nanoattn.positional import alibi_slopes, build_positional
from nanoattn.references.attention import (
    TOKENS,
    causal_softmax,
    heads64,
    layer,
    project,
    rotary_layer_outputs,
)
from nanoattn.references.core import acts, difference, randn
from nanoattn.references.fixtures import at_test_size


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
    with torch.no_grad(), mock.patch.object(routes, "MASK_CHUNK_ELEMENTS", B * cfg.n_head * 5 * T):
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
            got, expected = rotary_layer_outputs(ours, cfg, theirs, Qwen3NextRotaryEmbedding(hf), T)
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


Settings = tuple[tuple[str, int | None], ...]  # (pos, sliding_window) pairs


def written_out_score_function(fields: dict, settings: Settings, row: Callable) -> float:
    """The worst difference over MHA, GQA and MQA and each (pos, sliding_window) of ``settings``
    between a layer of ``fields`` and ``score_loops`` weighing each query's scores by
    ``row(attn, cfg, x, window)``."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        for pos, window in settings:
            attn, cfg = layer(n_kv_head, pos=pos, sliding_window=window, **fields)
            x = randn(2, TOKENS, 32, seed=1)
            expected, weights = score_loops(attn, x, row(attn, cfg, x, window), alibi_bias(pos))
            worst = max(worst, against_layer(attn, cfg, x, expected, weights))
    return worst


def stick_breaking_paper() -> float:
    """NoPE, ALiBi and a window of 5; MHA, GQA and MQA."""
    settings = (("nope", None), ("alibi", None), ("nope", 5))
    return written_out_score_function({"attn_fn": "stick_breaking"}, settings,
                                      lambda attn, cfg, x, window: stick_breaking_row(window))


def sigmoid_paper() -> float:
    """NoPE and ALiBi; MHA, GQA and MQA; n = max_seq_len = the inputs' 12 tokens."""
    return written_out_score_function({"attn_fn": "sigmoid"}, (("nope", None), ("alibi", None)),
                                      lambda attn, cfg, x, window: sigmoid_row(cfg.max_seq_len))


def fox_gates_row(attn: Attention, cfg: ModelConfig, x: torch.Tensor, window: int | None):
    """The forget gate's row, log f_t = log sigma(w_h . x_t + b_h) written out from the gate's weights."""
    gate = attn.forget_gate.proj
    with torch.no_grad():
        log_f = F.logsigmoid(x.double() @ gate.weight.double().T + gate.bias.double())  # [B, T, H]
    if log_f.std() < 0.2:
        raise AssertionError("the gates barely differ between tokens and heads: the check is weak")
    return forget_gate_row(log_f)


def fox_paper() -> float:
    """log f_t = log sigma(w_h . x_t + b_h) from the gate's weights; NoPE and ALiBi; MHA, GQA and MQA."""
    return written_out_score_function({"forget_gate": True}, (("nope", None), ("alibi", None)),
                                      fox_gates_row)


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
            got = attn.attend_heads(q, k, v, positions, positions, build_positional(cfg), 0)[0]
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
