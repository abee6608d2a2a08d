"""Abacus embeddings (McLeish et al. 2024, "Transformers Can Do Arithmetic with the Right
Embeddings", arXiv:2405.17399).

Each digit token gets a learned vector for its index within its number, added to its token
embedding: 1 for a number's first digit, 2 for its second, ..., reset at every number; every other
token gets index 0 (its own learned row). With numbers written least significant digit first (the
paper's format), digits of one significance share an index in both operands and the answer,
whatever the number's length. During training every index of a forward pass is shifted by one
offset k drawn uniformly from [0, ``abacus_max_offset``] (the paper's 100), so rows far past the
training digits are trained too and longer numbers at evaluation (no offset) read trained rows.

Choices, following the authors' module (mcleish7/arithmetic, ``abacus.py``):
- One k per forward pass, shared by the batch, added to the digits' indices only (k = 0 at
  evaluation); drawn from torch's generator, which checkpoints save, so a resumed run repeats it.
- The digits are ``model.abacus_digits``, the token ids of '0' .. '9', which the trainer reads
  from the tokenizer (a model is built with or without them; a forward pass needs them).
- The table has ``max_seq_len + abacus_max_offset + 1`` rows: the largest index a training row can
  make. A longer run of digits (or a longer input at evaluation) past it is refused in one line,
  never clamped, like learned positions past their table. It is an ``nn.Embedding``, initialised
  and optimised as every token table (N(0, init_std); ``train.embedding_lr_scale``).
- It reads tokens, not positions, so it adds to whatever ``model.pos`` does (the paper's Abacus
  alone is ``pos=nope``, Abacus+FIRE ``pos=fire``, Abacus+RoPE ``pos=rope``) and takes no part in
  given positions. Under a KV cache the index continues the newest cached token's run
  (``cache.carry``), so cached decoding equals recomputation.
"""

from __future__ import annotations

import torch
from torch import nn


def digit_indices(idx: torch.Tensor, digits: torch.Tensor,
                  previous: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's index within its run of digits, 1-based, 0 for a non-digit: idx [B, T] -> int64
    [B, T]. ``previous`` [B]: the index of the token before idx (a cache's newest), whose run idx may
    continue."""
    digit = torch.isin(idx, digits)  # [B, T]
    count = digit.long().cumsum(1)  # digits up to each token
    latest_reset = torch.where(digit, 0, count).cummax(1).values  # the count at the latest non-digit
    index = count - latest_reset
    if previous is not None:  # the tokens before idx's first non-digit continue the cached run
        leading = (~digit).long().cumsum(1) == 0  # [B, T]
        index = index + previous[:, None] * leading
    return index


class Abacus(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        self.max_offset = cfg.abacus_max_offset
        self.table = nn.Embedding(cfg.max_seq_len + cfg.abacus_max_offset + 1, cfg.d_model)
        digits = torch.tensor(cfg.abacus_digits if cfg.abacus_digits is not None else [], dtype=torch.long)
        self.register_buffer("digits", digits, persistent=False)
        # It reads a value from the tensor: compiled code calls it eagerly, between graphs, and so does
        # not compile again for every new largest index. Disabled here rather than by a decorator,
        # whose import of Dynamo every process importing nanoattn would pay.
        self.check_rows = torch.compiler.disable(check_abacus_rows)

    def forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        """The abacus vectors [B, T, d_model] of tokens idx [B, T] (continuing ``cache``'s, if any)."""
        if self.digits.numel() == 0:
            raise ValueError("model.abacus_digits=None is invalid for a forward pass: the abacus needs the "
                             "token ids of the digits 0-9 (the trainer reads them from the tokenizer)")
        previous = None if cache is None else cache.carried_state("abacus")
        index = digit_indices(idx, self.digits, previous)  # [B, T]
        if cache is not None:
            cache.carry("abacus", index[:, -1])
        if self.training and self.max_offset:
            offset = torch.randint(0, self.max_offset + 1, (), device=idx.device)
            index = torch.where(index > 0, index + offset, 0)
        self.check_rows(index, self.table.num_embeddings)
        return self.table(index)


def check_abacus_rows(index: torch.Tensor, rows: int) -> None:
    """Refuses abacus indices past a table of ``rows`` rows, naming the largest."""
    largest = int(index.max())
    if largest >= rows:
        raise ValueError(f"abacus index {largest} is past the abacus table of {rows} rows (model."
                         "max_seq_len + abacus_max_offset + 1): a run of that many digits is undefined")
