"""The interface every positional encoding implements.

An encoding may act in up to three places, and the attention block only ever asks it:
1. ``embed``: on token embeddings before the first block (sinusoidal, learned);
2. ``rotate``: on queries and keys inside every attention layer (RoPE and its scalings);
3. ``bias``: as an additive attention bias ``[n_head, Tq, Tk]`` (ALiBi).
The defaults do nothing, so NoPE is the base class itself. Positions are explicit int64
tensors (absolute token indices), so training, KV-cached decoding and sliding-window
evaluation all hand the encoding the same numbers for the same token.
"""

from __future__ import annotations

import torch
from torch import nn


class PositionalEncoding(nn.Module):
    adds_bias: bool = False  # True when ``bias`` returns a tensor; attention then takes the bias path
    # True when the rotation at a position depends on the sequence length (dynamic NTK).
    length_dependent_rotation: bool = False

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings x [B, T, d_model] at positions [T] -> the residual stream's input."""
        return x

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Queries or keys x [B, heads, T, head_dim] at positions [T]; seq_len = max position + 1."""
        return x

    def bias(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor | None:
        """Additive attention bias [n_head, Tq, Tk] (float32), or None."""
        return None

    def check_length(self, seq_len: int) -> None:
        """Raise ValueError when the encoding is undefined at positions up to seq_len - 1."""

    def rotation_changes(self, old_len: int, new_len: int) -> bool:
        """True when q and k are rotated differently at seq_len new_len than at old_len.

        Every cached key and value then belongs to an older rotation (past the first layer even
        through the hidden states), so exact decoding must re-encode the sequence (generate.py).
        """
        return False
