"""Reference checks of the mechanisms that mix heads (talking heads), against the paper's equations
written out and x-transformers."""

from __future__ import annotations

import math

import torch
from x_transformers.attend import Attend

from nanoattn.positional import build_positional
from nanoattn.references.attention import TOKENS, causal_softmax, heads64, layer, project
from nanoattn.references.core import acts, difference, randn
from nanoattn.references.scores import against_layer, projected


def talking_heads_paper() -> float:
    """Shazeer et al. 2020: J_g = q_g . k_g / sqrt(d), L_h = sum_g P_l[g, h] J_g, W = causal softmax(L),
    U_h = sum_g P_w[g, h] W_g, head h's output U_h v_h; the mixes drawn N(0, 0.3); MHA, GQA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 2, 1):
        attn, cfg = layer(n_kv_head, talking_heads=True)
        x = randn(2, TOKENS, 32, seed=1)
        q, k, v = heads64(attn, x)
        logits_mix = attn.talking_heads.logits_mix.detach().double()
        weights_mix = attn.talking_heads.weights_mix.detach().double()
        J = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)  # [B, H, T, T]
        W = causal_softmax(torch.einsum("bgij,gh->bhij", J, logits_mix))
        U = torch.einsum("bgij,gh->bhij", W, weights_mix)
        expected = project(attn, U @ v)
        acts(expected, project(attn, causal_softmax(J) @ v), "the mixes")
        worst = max(worst, against_layer(attn, cfg, x, expected, U))
    return worst


def talking_heads_x_transformers() -> float:
    """x-transformers' ``Attend(pre_talking_heads=True, post_talking_heads=True)`` on the layer's q, k, v:
    its logits' mix is a residual 1x1 convolution over heads (sim + W_pre sim), its weights' mix W_post
    attn, so P_l = I + W_pre^T and P_w = W_post^T; MHA and MQA."""
    worst = 0.0
    for n_kv_head in (4, 1):
        attn, cfg = layer(n_kv_head, talking_heads=True)
        x, positions = randn(2, TOKENS, 32, seed=1), torch.arange(TOKENS)
        theirs = Attend(causal=True, heads=4, pre_talking_heads=True, post_talking_heads=True)
        with torch.no_grad():
            logits_mix, weights_mix = attn.talking_heads.logits_mix, attn.talking_heads.weights_mix
            theirs.pre_softmax_talking_heads.weight.copy_((logits_mix - torch.eye(4)).T[:, :, None, None])
            theirs.post_softmax_talking_heads.weight.copy_(weights_mix.T[:, :, None, None])
            q, k, v = projected(attn, x)
            got = attn.attend_heads(q, k, v, positions, positions, build_positional(cfg), 0)[0]
            expected = theirs(q, k.expand(-1, 4, -1, -1), v.expand(-1, 4, -1, -1))[0]
        worst = max(worst, difference(got, expected))
    return worst
