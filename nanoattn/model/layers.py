"""Norms and feed-forward blocks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.kernels import Linear


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """F.dropout, not called when it is the identity: even then each call costs ~10 us of dispatch,
    a few percent of a batch-1 decoding step of a small model."""
    return F.dropout(x, p, training) if training and p > 0 else x


def make_norm(cfg) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps, bias=cfg.bias)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, the tanh approximation (its "gelu_new")."""
    return F.gelu(x, approximate="tanh")


def relu_squared(x: torch.Tensor) -> torch.Tensor:
    """ReLU² (So et al. 2021, Primer), the modded-nanogpt speedrun's MLP activation."""
    return F.relu(x).square()


ACTIVATIONS = {"gelu": gelu_tanh, "relu2": relu_squared}  # of the two-matrix MLP, by cfg.mlp


class TwoLayerMLP(nn.Module):
    """GPT-2's MLP shape: Linear, activation (``cfg.mlp``: gelu or relu2), Linear."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.up = Linear(cfg.d_model, cfg.ffn_dim, bias=cfg.bias)
        self.down = Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)
        self.activation = ACTIVATIONS[cfg.mlp]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.activation(self.up(x)))


class SwiGLUMLP(nn.Module):
    """LLaMA's MLP, silu(x W_gate) * (x W_up) W_down, with gate and up fused in one matmul."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.gate_up = Linear(cfg.d_model, 2 * cfg.ffn_dim, bias=cfg.bias)
        self.down = Linear(cfg.ffn_dim, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)  # [B, T, d_ff] each
        return self.down(F.silu(gate) * up)


def make_mlp(cfg) -> nn.Module:
    return SwiGLUMLP(cfg) if cfg.mlp == "swiglu" else TwoLayerMLP(cfg)
