"""Learned absolute positions (GPT-2, BERT): a table of max_seq_len vectors.

The table has no value past its length, so longer inputs are refused with a clear error
instead of being clamped or crashing on an index.
"""

from __future__ import annotations

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding


class LearnedPositionalEncoding(PositionalEncoding):
    acts_on_embeddings = True
    learned_length = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.table = nn.Embedding(cfg.max_seq_len, cfg.d_model)

    def reset_parameters(self) -> None:
        # Zeros, not GPT-2's N(0, 0.02): the table starts as NoPE and holds only what training writes
        # (the model's own init would draw it N(0, init_std) otherwise): the position signal grows
        # from nothing, as sinusoidal_scaled's does (docs/fair_baselines.md).
        nn.init.zeros_(self.table.weight)

    @property
    def max_len(self) -> int:
        return self.table.num_embeddings

    def check_length(self, seq_len: int) -> None:
        if seq_len > self.max_len:
            raise ValueError(f"sequence length {seq_len} is past the learned position table "
                             f"(pos='learned', max_seq_len={self.max_len}): learned positions are "
                             f"undefined beyond it")

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # The model checked the positions against the table (``check_length``) before: reading their
        # largest here again would break a compiled graph at every call.
        return x + self.table(positions)  # [B, T, d] + [(B,) T, d]
