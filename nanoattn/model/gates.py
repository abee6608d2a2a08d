"""Pieces of attention that keep state in the KV cache or read the layer's raw projections, each
switched on by one ``ModelConfig`` field (the stateless mechanisms are ``nanoattn.mechanisms``).

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
from torch import nn

from nanoattn.kernels import Linear


class KVShift(nn.Module):
    """FoX Pro's data-dependent shift of keys and values: k_t = a_t k_{t-1} + (1 - a_t) k_t with
    a = sigma(x w) per K/V head and token from the attention's input, the values with their own a,
    over the raw projections (before QK-norm and any rotation), k_{-1} = 0. Initialised as every linear
    layer (a near 1/2), as the authors'. With a cache, the previous token's raw key and value are the
    newest ones it carries (``KVCache.carry``)."""

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.layer, self.heads = layer, cfg.n_kv_head
        self.proj = Linear(cfg.d_model, 2 * cfg.n_kv_head, bias=False)  # a for the keys, then the values

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache=None):
        """x [B, T, d_model]; k, v [B, Hkv, T, D] raw -> (k, v) shifted."""
        raw = torch.cat([k, v], dim=1)  # [B, 2 Hkv, T, D]
        held = None if cache is None else cache.carried_state(("kv_shift", self.layer))
        before = raw.new_zeros(raw[:, :, :1].shape) if held is None else held.to(raw.dtype)
        if cache is not None:
            cache.carry(("kv_shift", self.layer), raw[:, :, -1:])
        previous = torch.cat([before, raw[:, :, :-1]], dim=2)  # [B, 2 Hkv, T, D]: each token's predecessor
        a = torch.sigmoid(self.proj(x).float()).transpose(1, 2)[..., None].to(raw.dtype)  # [B, 2 Hkv, T, 1]
        return (a * previous + (1 - a) * raw).split(self.heads, dim=1)


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
        held = None if cache is None else cache.carried_state(("canon", self.layer))
        before = x.new_zeros(B, width - 1, D) if held is None else held.to(x.dtype)
        inputs = torch.cat([before, x], dim=1)  # [B, width - 1 + T, D]
        if cache is not None:
            cache.carry(("canon", self.layer), inputs[:, T:])
        w = self.weight.to(x.dtype)
        return x + sum(inputs[:, j:j + T] * w[:, j] for j in range(width))
