"""Multi-head latent attention (MLA; DeepSeek-AI 2024, DeepSeek-V2, arXiv:2405.04434, section 2.1).

- Keys and values come from one joint latent c = RMSNorm(x W_DKV) of rank ``mla_kv_rank``: per
  head, k_nope = c W_UK and v = c W_UV (``kv_b`` holds both, each head's rows [k_nope | v], as
  DeepSeek stores them).
- Position is decoupled: each query head has ``mla_rope_dim`` more dims q_rope, and all heads share
  one rotary key k_rope = RoPE(x W_KR). A head's query is [q_nope | q_rope] and its key
  [k_nope | k_rope], so scores are scaled by 1/sqrt(head_dim + mla_rope_dim).
- Queries come from x, or through a low-rank latent (``mla_q_rank``): RMSNorm(x W_DQ) W_UQ.
- The cache holds only c and k_rope: ``mla_kv_rank + mla_rope_dim`` numbers per token and layer,
  against ``2 * n_kv_head * head_dim`` for the fused attention. k_rope is cached unrotated and
  rotated at its position when read (slots for StreamingLLM), and the latent is expanded to every
  head's k and v at each step: the plain exact form, not DeepSeek's absorbed matmuls.
- The rotation is the model's RoPE (its theta, fraction, p) at width ``mla_rope_dim``, an instance
  of its own; the model's positional encoding is still asked for its bias, which RoPE does not add.
"""

from __future__ import annotations

import torch
from torch import nn

from nanoattn.kernels import Linear
from nanoattn.model.attention import CausalAttention, key_positions
from nanoattn.positional.rope import RotaryPositionalEncoding


class LatentAttention(CausalAttention):
    def __init__(self, cfg, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        self.n_head, self.head_dim = cfg.n_head, cfg.head_dim
        self.rank, self.rope_dim = cfg.mla_kv_rank, cfg.mla_rope_dim
        H, D, R = cfg.n_head, cfg.head_dim, cfg.mla_rope_dim
        self.low_rank_queries = cfg.mla_q_rank is not None
        if not self.low_rank_queries:
            self.q_proj = Linear(cfg.d_model, H * (D + R), bias=cfg.bias)
        else:
            self.q_a = Linear(cfg.d_model, cfg.mla_q_rank, bias=cfg.bias)
            self.q_norm = nn.RMSNorm(cfg.mla_q_rank, eps=cfg.norm_eps)
            self.q_b = Linear(cfg.mla_q_rank, H * (D + R), bias=cfg.bias)
        self.kv_a = Linear(cfg.d_model, self.rank + R, bias=cfg.bias)  # [latent | shared rotary key]
        self.kv_norm = nn.RMSNorm(self.rank, eps=cfg.norm_eps)
        # Over every cached latent at each step (rows grow with the length): a plain nn.Linear, since
        # ``Linear``'s kernel choice per row count would be measured, and compiled, at every length.
        self.kv_b = nn.Linear(self.rank, H * 2 * D, bias=cfg.bias)  # per head [k_nope | v]
        self.proj = Linear(H * D, cfg.d_model, bias=cfg.bias)
        self.rope = RotaryPositionalEncoding(cfg, [layer], head_dim=R)

    def _qkv(self, x, pos, positions, seq_len, cache, layer, value_embed):
        B, T, _ = x.shape
        H, D, R = self.n_head, self.head_dim, self.rope_dim
        # The norms take their weights' dtype (as QK-norm's): torch's fused RMSNorm refuses bf16 input
        # with float32 weights.
        if self.low_rank_queries:
            q = self.q_b(self.q_norm(self.q_a(x).to(self.q_norm.weight.dtype)))
        else:
            q = self.q_proj(x)
        q_nope, q_rope = q.view(B, T, H, D + R).transpose(1, 2).split([D, R], dim=-1)  # [B, H, T, D], [.., R]
        latent, k_rope = self.kv_a(x).split([self.rank, R], dim=-1)  # [B, T, rank], [B, T, R]
        latent = self.kv_norm(latent.to(self.kv_norm.weight.dtype))
        latent, k_rope = latent[:, None], k_rope[:, None]  # one "head" each: [B, 1, T, .]
        if cache is not None:
            latent, k_rope = cache.update(layer, latent, k_rope)  # every cached token: [B, 1, Tk, .]
        Tk = latent.shape[2]
        k_positions = key_positions(positions, seq_len, Tk, cache)
        q = torch.cat([q_nope, self.rope.rotate(q_rope, positions, seq_len)], dim=-1)  # [B, H, T, D + R]
        k_nope, v = self.kv_b(latent[:, 0]).view(B, Tk, H, 2 * D).transpose(1, 2).split([D, D], dim=-1)
        k_rope = self.rope.rotate(k_rope.to(k_nope.dtype), k_positions, seq_len).expand(B, H, Tk, R)
        return q, torch.cat([k_nope, k_rope], dim=-1).to(q.dtype), v.to(q.dtype), k_positions
