"""The interface every positional encoding implements.

An encoding may act in these places, and the attention block only ever asks it:
1. ``embed``: on token embeddings before the first block (sinusoidal, learned). Such an
   encoding (``acts_on_embeddings``) can only be the whole model's choice, never one layer's.
2. ``rotate``: the same position-dependent map on queries and keys, called once on both
   (RoPE and its scalings, partial RoPE, p-RoPE).
3. ``scale_queries`` / ``scale_keys``: separate maps where queries and keys differ (xPos's
   decay, Llama 4's query temperature). Keys are mapped at their own position before they are
   cached, so cached decoding stays exact.
4. ``bias``: an additive attention bias, from positions only (ALiBi, T5, KERPLE, FIRE) or also
   from the queries and keys (CoPE). It is asked for one chunk of queries at a time, so no
   ``[n_head, T, T]`` tensor is ever built for a long input.
The defaults do nothing, so NoPE is the base class itself. Positions are explicit int64
tensors (absolute token indices), so training, KV-cached decoding and sliding-window
evaluation all hand the encoding the same numbers for the same token.

Positions are [T] by default, 0..T-1 (the model's ``arange``), shared by every row. A batch may
instead give each token its own position, [B, T] (randomized positions, position coupling: the
ids need not increase or differ, since causality is by token order, never by position); an
encoding that reads its positions (``takes_positions``) computes the same with either shape,
its outputs gaining a batch axis, and every other one is refused given positions in one line
(``positions_refusal``). The [T] path is the fast one: nothing is built per row.

A model may use a different encoding in each layer (``ModelConfig.pos`` as a list, see
``layout.py``); ``for_layer`` returns the encoding that acts in one layer. An encoding whose
parameters differ per layer (FIRE, CoPE) is built once with ``layers``, the indices of the layers
that use it, and receives the layer index in ``bias``.

An encoding whose parameters must stay in a range (KERPLE) puts them back in it with
``project_parameters``, which the trainer calls on every encoding after each optimizer update.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class PositionalEncoding(nn.Module):
    acts_on_embeddings: bool = False  # True when ``embed`` adds positions: only a whole-model choice
    rotary: bool = False  # True when it rotates by rope_theta (and rope_scaling applies to it)
    # True when it has no value at positions >= max_seq_len (a table of that many rows, learned):
    # longer inputs are refused, and a trained checkpoint's max_seq_len cannot change.
    learned_length: bool = False
    adds_bias: bool = False  # True when ``bias`` returns a tensor; attention then takes the bias path
    # True when the rotation at a position depends on the sequence length (dynamic NTK, LongRoPE).
    length_dependent_rotation: bool = False
    # True when it computes from the positions it is handed, given per-token ones [B, T] included;
    # False (NoPE, CoPE: nothing to take) refuses given positions, which would change nothing.
    takes_positions: bool = False

    def __init__(self, cfg, layers: Sequence[int]) -> None:
        """``layers``: the indices of the layers that use this encoding (every layer when uniform)."""
        super().__init__()
        self.layers = tuple(layers)

    @classmethod
    def check_config(cls, cfg) -> None:
        """Raise a one-line ValueError when ``cfg`` (a ModelConfig using this encoding) is invalid for it."""

    @classmethod
    def key_width(cls, head_dim: int) -> int:
        """The width of a query or key head after ``rotate`` and the scales, as attention reads it and the
        KV cache stores it: head_dim, or more for a map to other coordinates (PoPE: 2 x head_dim)."""
        return head_dim

    def reset_parameters(self) -> None:
        """Initialise the encoding's own parameters; the model calls it after its generic init."""

    def project_parameters(self) -> None:
        """Put this encoding's own stored parameters back in their range, in place, after an update
        (projected gradient descent: the forward then uses them as they are)."""

    def for_layer(self, layer: int) -> PositionalEncoding:
        """The encoding acting in ``layer``: itself, unless this is a per-layer layout."""
        return self

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings x [B, T, d_model] at positions [T] or [B, T] -> the residual stream's input."""
        return x

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        """Queries and keys x [B, heads, T, head_dim] at positions [T] or [B, T]; seq_len > every position."""
        return x

    def scale_queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries q [B, n_head, T, head_dim] after ``rotate``, at positions [T] or [B, T]."""
        return q

    def scale_keys(self, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Keys k [B, n_kv_head, T, head_dim] after ``rotate``, at their own positions [T] or [B, T]."""
        return k

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor,
             layer: int) -> torch.Tensor | None:
        """Additive attention bias (float32) for queries q [B, n_head, Tq, D] at q_positions [Tq] over
        keys k [B, n_kv_head, Tk, D] at k_positions [Tk]: [n_head, Tq, Tk] or [B, n_head, Tq, Tk],
        or None; per-token positions [B, Tq] and [B, Tk] give [B, n_head, Tq, Tk]. Entries where a key
        is after its query (by token order) are masked by the caller.
        """
        return None

    def check_length(self, seq_len: int) -> None:
        """Raise ValueError when the encoding is undefined at positions up to seq_len - 1."""

    def rotation_changes(self, old_len: int, new_len: int) -> bool:
        """True when q and k are rotated differently at seq_len new_len than at old_len.

        Every cached key and value then belongs to an older rotation (past the first layer even
        through the hidden states), so exact decoding must re-encode the sequence (generate.py).
        """
        return False

    def layer_slot(self, layer: int) -> int:
        """Index of ``layer`` among the layers using this encoding (for per-layer parameters)."""
        return self.layers.index(layer)
