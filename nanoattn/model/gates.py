"""Pieces that act around attention's softmax, each switched on by one ``ModelConfig`` field.

- ``OutputGate`` (``attn_gate``): gated attention, Qiu et al. 2025, "Gated Attention for Large
  Language Models" (arXiv:2505.06708), the G1 placement the paper found best: each head's output
  is multiplied by sigmoid(x W_g) before W_O, x the attention's input (the block's normalised
  input). ``headwise``: one gate per head, W_g of d_model x heads; ``elementwise``: one per channel,
  d_model x d_model. Qwen3-Next computes the elementwise form with W_g's rows interleaved with the
  query rows of its ``q_proj`` (head h's [q_h | g_h]); x-transformers' ``gate_values=True`` (with
  ``gate_values_headwise`` for one gate per head) is the same function with W_g started at zero
  and without a bias, where ours is drawn like every projection and has a bias with ``bias``.
  With differential attention a head is a pair, gated as one.
- ``ScalableSoftmax`` (``ssmax``): Nakanishi 2025, "Scalable-Softmax Is Superior for Attention"
  (arXiv:2501.19399): the softmax over n logits z becomes softmax((s log n) z), s learned per
  head and layer, n the keys the query sees: position + 1 under the causal mask, at most the
  window in a windowed layer (position = slot in a streaming cache, which is the same count). The
  paper's implementation scales the query by s log n, which is what this does, so SDPA's kernels
  still serve and the KV cache is untouched: a query's factor depends on its own position only,
  so cached decoding is exact. s starts at 1 / log(max_seq_len): the plain softmax at the training
  length, sharper past it (the paper learns s; its starting value is this module's choice). Llama
  4's query temperature (``temperature_floor_scale``, ``positional/nope.py``) is a fixed relative
  of it after the same paper: 1 + attn_scale log(floor(n / floor_scale) + 1), one for every head,
  equal to 1 within floor_scale tokens, where SSMax is s_h log n from the first token. Both scale
  q.k / sqrt(d) and not an encoding's additive bias (ALiBi's keeps its slope), and a score cap
  acts after the scale.
- ``ExcludeSelf`` (``xsa``): exclusive self-attention, Zhai 2026 (arXiv:2603.09078): z_i = y_i -
  (y_i . v_i / |v_i|^2) v_i, each head's output minus its projection on the token's own value (with
  GQA, the value of the head's K/V group; with value embeddings, the mixed value the cache holds).
  This is the paper's fixed form; modded-nanogpt's record (PR #264, "gated XSA") instead learns a
  gate per layer and head on the subtracted projection, started at 0 (plain attention). It acts
  on the attention's output before the output gate, so the maps are unchanged and the cache needs
  nothing (the newest values are the tokens' own).
- ``Canon`` (``canon``): canon layers, Allen-Zhu 2025, "Physics of Language Models: Part 4.1"
  (arXiv:2512.17351), at the Canon-A place: h_t + sum_j w_j * h_{t-j}, j = 0 .. width - 1, a causal
  depthwise convolution with a residual over the normalised input of each attention block, no
  bias or activation, taps drawn like the reference's ``nn.Conv1d`` (uniform within 1/sqrt(width)).
  The KV cache keeps each layer's newest width - 1 inputs, so decoding is exact. Token shift
  (``token_shift``) is the width-2 case with one gate: e_t + g * e_{t-1}, a current tap of 0 and a
  learned previous tap g, once on the token embeddings instead of in every block.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.model.kernels import Linear


class QKNorm(nn.Module):
    """RMSNorm of every query and key head over head_dim, one gain for the queries and one for the
    keys shared by all heads (Qwen 3's q_norm / k_norm). The output keeps the input's dtype."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.split = [cfg.n_head, cfg.n_kv_head]
        self.q = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)
        self.k = nn.RMSNorm(cfg.head_dim, eps=cfg.norm_eps)

    def forward(self, qk: torch.Tensor) -> torch.Tensor:
        """qk [B, H + Hkv, T, D] -> the same shape, each head normalised."""
        # In the weights' dtype: torch's fused RMSNorm refuses bf16 heads with float32 weights (a
        # warning, then a composite path whose output, rounded back to bf16, is the same).
        q, k = qk.to(self.q.weight.dtype).split(self.split, dim=1)
        return torch.cat([self.q(q), self.k(k)], dim=1).to(qk.dtype)

    def side(self, x: torch.Tensor, side: str) -> torch.Tensor:
        """Queries (side 'q') or keys ('k') alone, [B, heads, T, D]."""
        norm = getattr(self, side)
        return norm(x.to(norm.weight.dtype)).to(x.dtype)


class OutputGate(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.heads = cfg.attention_heads
        # Every attention's heads are d_model wide together (n_head x head_dim, or the pairs' 2 x head_dim).
        width = self.heads if cfg.attn_gate == "headwise" else cfg.d_model
        self.proj = Linear(cfg.d_model, width, bias=cfg.bias)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """x [B, T, d_model] the attention's input, y the heads' outputs [B, heads, T, Dv] -> y gated."""
        B, T, _ = x.shape
        gate = torch.sigmoid(self.proj(x)).view(B, T, self.heads, -1).transpose(1, 2)  # [B, heads, T, 1 | Dv]
        return y * gate.to(y.dtype)


class OutputNorm(nn.Module):
    """FoX Pro's output normalisation: RMSNorm of each head's output over its values, with a gain per
    channel of the d_model the heads make together (the authors' GroupNorm with one group a head)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.heads, self.eps = cfg.attention_heads, cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        """y [B, heads, T, Dv] -> each head normalised, in y's dtype (the mean square in float32)."""
        z = y.float() * torch.rsqrt(y.float().square().mean(-1, keepdim=True) + self.eps)
        return (z * self.weight.view(self.heads, 1, -1)).to(y.dtype)


class KVShift(nn.Module):
    """FoX Pro's data-dependent shift of keys and values: k_t = a_t k_{t-1} + (1 - a_t) k_t with
    a = sigma(x w) per K/V head and token from the attention's input, the values with their own a,
    over the raw projections (before QK-norm and any rotation), k_{-1} = 0. Initialised as every linear
    layer (a near 1/2), as the authors'. With a cache, the previous token's raw key and value are the
    newest ones it holds (``KVCache.shift_inputs``)."""

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.layer, self.heads = layer, cfg.n_kv_head
        self.proj = Linear(cfg.d_model, 2 * cfg.n_kv_head, bias=False)  # a for the keys, then the values

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache=None):
        """x [B, T, d_model]; k, v [B, Hkv, T, D] raw -> (k, v) shifted."""
        raw = torch.cat([k, v], dim=1)  # [B, 2 Hkv, T, D]
        held = cache is not None and cache.length > 0
        before = cache.shift_inputs[self.layer].to(raw.dtype) if held else raw.new_zeros(raw[:, :, :1].shape)
        if cache is not None:
            cache.shift_inputs[self.layer] = raw[:, :, -1:].clone()
        previous = torch.cat([before, raw[:, :, :-1]], dim=2)  # [B, 2 Hkv, T, D]: each token's predecessor
        a = torch.sigmoid(self.proj(x).float()).transpose(1, 2)[..., None].to(raw.dtype)  # [B, 2 Hkv, T, 1]
        return (a * previous + (1 - a) * raw).split(self.heads, dim=1)


class ScalableSoftmax(nn.Module):
    def __init__(self, cfg, window: int | None) -> None:
        super().__init__()
        self.window = window
        self.s = nn.Parameter(torch.full((cfg.n_head,), 1 / math.log(max(cfg.max_seq_len, 2))))

    def keys_seen(self, positions: torch.Tensor) -> torch.Tensor:
        """n for queries at positions [T]: position + 1, at most the window."""
        n = positions + 1
        return n if self.window is None else n.clamp(max=self.window)

    def forward(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries q [B, n_head, T, D] at positions [T] -> q * s_h log n, the factor in float32."""
        factor = self.s[:, None] * torch.log(self.keys_seen(positions).float())  # [n_head, T]
        return q * factor.to(q.dtype)[:, :, None]


class ExcludeSelf(nn.Module):
    """No parameters: a module so that head analysis can read its inputs with a forward hook."""

    def forward(self, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """y [B, H, T, Dv] the heads' outputs, v [B, Hkv, T, Dv] the same tokens' values -> y minus
        its projection on v (each group of H / Hkv query heads on its K/V head's value)."""
        B, H, T, Dv = y.shape
        grouped = y.reshape(B, v.shape[1], -1, T, Dv)  # [B, Hkv, H / Hkv, T, Dv]
        unit = F.normalize(v, dim=-1)[:, :, None]  # [B, Hkv, 1, T, Dv]; 0 for a zero value
        return (grouped - (grouped * unit).sum(-1, keepdim=True) * unit).view(B, H, T, Dv)


class Canon(nn.Module):
    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.layer = layer
        # [d_model, width]: tap j weighs the input width - 1 - j tokens back (nn.Conv1d's order).
        bound = 1 / math.sqrt(cfg.canon)
        self.weight = nn.Parameter(torch.empty(cfg.d_model, cfg.canon).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor, cache=None) -> torch.Tensor:
        """x [B, T, d_model] -> x + the causal depthwise convolution of x. Before the first token
        the inputs are 0; with a cache, the ones it keeps from earlier calls."""
        B, T, D = x.shape
        width = self.weight.shape[1]
        held = cache is not None and cache.length > 0
        before = cache.canon_inputs[self.layer].to(x.dtype) if held else x.new_zeros(B, width - 1, D)
        inputs = torch.cat([before, x], dim=1)  # [B, width - 1 + T, D]
        if cache is not None:
            cache.canon_inputs[self.layer] = inputs[:, T:].clone()  # a view would keep the whole prefill
        w = self.weight.to(x.dtype)
        return x + sum(inputs[:, j:j + T] * w[:, j] for j in range(width))
