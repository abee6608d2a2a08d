"""FoX Pro's output normalisation (``attn_output_norm``): Lin et al. 2025, "Forgetting Transformer".

RMSNorm of each head's output over its values, with a gain per channel of the d_model the heads make
together (the authors' GroupNorm with one group a head), before the output gate.
"""

from __future__ import annotations

import torch
from torch import nn

from nanoattn.mechanisms.base import Mechanism
from nanoattn.validation import check_bool


class OutputNorm(Mechanism):
    fields = ("attn_output_norm",)
    attribute = "output_norm"
    paired_heads_refusal = "a differential head is normalised already, over its pair of values"

    def __init__(self, cfg, layer: int) -> None:
        super().__init__(cfg, layer)
        self.n_heads, self.eps = cfg.attention_heads, cfg.norm_eps
        self.weight = nn.Parameter(torch.ones(cfg.d_model))

    @classmethod
    def check_config(cls, cfg) -> None:
        check_bool("model", "attn_output_norm", cfg.attn_output_norm)

    def heads(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Each head of y normalised, in y's dtype (the mean square in float32)."""
        z = y.float() * torch.rsqrt(y.float().square().mean(-1, keepdim=True) + self.eps)
        return (z * self.weight.view(self.n_heads, 1, -1)).to(y.dtype)
