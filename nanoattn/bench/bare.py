"""The bare reference of the ``train`` section: the default block written as plainly as PyTorch allows.

Fused QKV, RoPE from a cos/sin table, SDPA with ``is_causal`` (grouped K/V through
``enable_gqa``), RMSNorm, SwiGLU, a tied or untied head, token shift if the model has it, and
cross-entropy: no registry, no cache, no checks, no hooks. Its parameter names are GPT's, so it
loads a GPT's weights, and from the same weights it computes the same loss (the section reports
both initial losses): the same function and the same FLOPs, whatever nanoattn's machinery costs
around them. It covers the default family (RoPE on every dim, RMSNorm, SwiGLU, no bias, plain
attention) and refuses anything else in one line.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.config import ModelConfig
from nanoattn.validation import declared_defaults

# The fields BareGPT reads: the shape, RoPE's base, the norm's epsilon, token shift, tied embeddings, the
# initialization (its weights are a GPT's) and the attention kernel (a route to the same function). Every
# other field must hold its declared default, the plain block's value, so that a mechanism added to the
# config later is refused here rather than silently left out.
IMPLEMENTED = frozenset({"vocab_size", "d_model", "n_layer", "n_head", "n_kv_head", "d_ff", "ffn_multiple_of",
                         "max_seq_len", "rope_theta", "norm_eps", "token_shift", "tie_embeddings", "init_std",
                         "attn_kernel"})
PLAIN = {name: value for name, value in declared_defaults(ModelConfig).items() if name not in IMPLEMENTED}


class BareBlock(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.attn_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(cfg.d_model, (cfg.n_head + 2 * cfg.n_kv_head) * cfg.head_dim, bias=False)
        self.attn.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.mlp_norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_up = nn.Linear(cfg.d_model, 2 * cfg.ffn_dim, bias=False)
        self.mlp.down = nn.Linear(cfg.ffn_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        widths = [self.n_head * self.head_dim, self.n_kv_head * self.head_dim, self.n_kv_head * self.head_dim]
        q, k, v = self.attn.qkv(self.attn_norm(x)).split(widths, dim=-1)
        q = rotate(q.view(B, T, self.n_head, self.head_dim).transpose(1, 2), cos, sin)
        k = rotate(k.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2), cos, sin)
        v = v.view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_head != self.n_head)
        x = x + self.attn.proj(y.transpose(1, 2).reshape(B, T, D))
        gate, up = self.mlp.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.mlp.down(F.silu(gate) * up)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The half-split rotation of x [B, H, T, d] by angles whose cos/sin are [T, d/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class BareGPT(nn.Module):
    """``forward(x, y)`` -> the mean next-token loss, like ``nanoattn.train.step.LossModule``."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        for field, plain in PLAIN.items():
            if getattr(cfg, field) != plain:
                raise ValueError(f"model.{field}={getattr(cfg, field)!r} is outside the bare reference "
                                 f"(it implements {field}={plain!r})")
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.shift_gate = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.token_shift else None
        self.blocks = nn.ModuleList(BareBlock(cfg) for _ in range(cfg.n_layer))
        self.norm = nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        dims = torch.arange(0, cfg.head_dim, 2, dtype=torch.int64).float()
        self.register_buffer("inv_freq", 1.0 / cfg.rope_theta ** (dims / cfg.head_dim), persistent=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(x.device.type, enabled=False):  # the phase in float32
            angles = torch.outer(torch.arange(x.shape[1], device=x.device).float(), self.inv_freq)
        cos, sin = angles.cos(), angles.sin()
        h = self.tok_emb(x)
        if self.shift_gate is not None:
            h = h + self.shift_gate * F.pad(h[:, :-1], (0, 0, 1, 0))
        for block in self.blocks:
            h = block(h, cos, sin)
        logits = self.lm_head(self.norm(h))
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
