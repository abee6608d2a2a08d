"""Randomized positions (Ruoss et al. 2023, "Randomized Positional Encodings Boost Length
Generalization of Transformers", arXiv:2305.16843): ``train.random_positions=L``.

Each training row of T tokens takes an ordered random sample of T distinct positions from [0, L),
L much larger than the training length, so every position an evaluation up to L asks for was seen
in training, at gaps that shrink as rows grow. It wraps any data (corpus windows or task rows)
and adds positions [B, T] to its training batches; validation batches keep the default 0..T-1, as
evaluation does (the authors' code samples at test time too; here evaluation uses the positions a
model is asked at, 0..T-1, unless given others).

Each row's sample comes from its own generator seeded with (stream, seed, step, micro_step, row),
the global row index: a pure function of the step like the batches themselves, so a resumed run
draws the same positions and the global batch does not depend on the number of ranks.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

STREAM = 0x72706F73  # first word of every row's positions seed


def ordered_sample(rng: np.random.Generator, length: int, count: int) -> np.ndarray:
    """``count`` distinct positions of [0, length), drawn uniformly without replacement, increasing."""
    return np.sort(rng.choice(length, size=count, replace=False))


class RandomPositions:
    """``data``'s batches, each training row at an ordered random sample of positions from [0, length)."""

    def __init__(self, data: Any, length: int) -> None:
        self.data, self.length = data, length

    def __getattr__(self, name: str) -> Any:  # val_batches, tokenizer, vocab_size, ...
        return getattr(self.data, name)

    def train_batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, micro_step: int = 0,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, ...]:
        """(x, y, positions) [batch_size, seq_len]: the data's batch and each row's positions."""
        if seq_len > self.length:
            raise ValueError(f"train.random_positions={self.length} is invalid: rows of {seq_len} tokens "
                             "need at least as many positions to draw from")
        x, y = self.data.train_batch(step, batch_size=batch_size, seq_len=seq_len, seed=seed,
                                     micro_step=micro_step, rank=rank, world_size=world_size)
        first = rank * batch_size
        rows = [ordered_sample(np.random.default_rng([STREAM, seed, step, micro_step, row]), self.length,
                               seq_len) for row in range(first, first + batch_size)]
        return x, y, torch.from_numpy(np.stack(rows)).to(torch.int64)
