"""Gated attention (``attn_gate``): Qiu et al. 2025, "Gated Attention for Large Language Models"
(arXiv:2505.06708), the G1 placement the paper found best.

Each head's output is multiplied by sigmoid(x W_g) before W_O, x the attention's input (the block's
normalised input). ``headwise``: one gate per head, W_g of d_model x heads; ``elementwise``: one per
channel, d_model x d_model. Qwen3-Next computes the elementwise form with W_g's rows interleaved with
the query rows of its ``q_proj`` (head h's [q_h | g_h]); x-transformers' ``gate_values=True`` (with
``gate_values_headwise`` for one gate per head) is the same function with W_g started at zero and
without a bias, where ours is drawn like every projection and has a bias with ``bias``. With
differential attention a head is a pair, gated as one.

Statistic: ``mean_gate`` per layer and head (each head's gate averaged over its channels), its ``mean``
and ``near_zero``, the share of heads whose mean gate is below ``GATE_NEAR_ZERO``.
"""

from __future__ import annotations

from typing import Any

import torch

from nanoattn.kernels import Linear
from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_choice

ATTN_GATES = ("none", "headwise", "elementwise")
# A head whose gate averages below this is counted as switched off (its output mostly 0).
GATE_NEAR_ZERO = 0.1


class OutputGate(Mechanism):
    fields = ("attn_gate",)
    attribute = "output_gate"
    observes = True

    def __init__(self, cfg, layer: int) -> None:
        super().__init__(cfg, layer)
        self.n_heads = cfg.attention_heads
        # Every attention's heads are d_model wide together (n_head x head_dim, or the pairs' 2 x head_dim).
        width = self.n_heads if cfg.attn_gate == "headwise" else cfg.d_model
        self.proj = Linear(cfg.d_model, width, bias=cfg.bias)

    @classmethod
    def check_config(cls, cfg) -> None:
        check_choice("model", "attn_gate", cfg.attn_gate, ATTN_GATES)

    def heads(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        gate = torch.sigmoid(self.proj(x)).view(B, T, self.n_heads, -1).transpose(1, 2)  # [B, heads, T, 1|Dv]
        if self.first_query is not None:
            self.observe(gate.float().mean(-1))
        return y * gate.to(y.dtype)

    @classmethod
    def statistic(cls, layers: list[OutputGate], seq_len: int) -> dict[str, Any]:
        gate = torch.stack([layer.observed_mean() for layer in layers])  # [n_layer, heads]
        return {"mean_gate": gate.tolist(), "mean": float(gate.mean()),
                "near_zero": float((gate < GATE_NEAR_ZERO).double().mean())}

    @classmethod
    def headline(cls, statistic: dict[str, Any]) -> tuple[str, float]:
        return "mean gate", statistic["mean"]
