"""Batches from a prepared folder: random training windows, fixed validation windows, sequential walks.

A split is read as one sequence of token ids however many shards hold it (``shards.SplitTokens``),
so every rule below is the same for one shard or many.

Design choices:

- ``train_batch`` is a pure function of (seed, step, micro_step, rank, world_size), with no iterator
  state: a run resumed at step s draws exactly the batches it would have drawn, and a checkpoint
  only needs the step. For one (seed, step, micro_step) a single RNG stream draws the starts of
  the whole global batch, ``batch_size * world_size`` distinct windows (without replacement);
  rank r takes the r-th slice. So ranks never share a window, and the global batch does not depend
  on how it is split: 2 ranks of 8 see exactly the windows of 1 rank of 16.
- ``val_batches`` are evenly spaced over the validation split, with no randomness: the same
  (n_batches, batch_size, seq_len) gives the same windows in every run, so validation losses
  compare across runs, and they cover the split instead of clustering.
- ``sequential`` walks a split in order for length evaluation; its docstring says exactly which
  targets each window adds, so a perplexity evaluator scores every token once.
- A window is ``seq_len + 1`` consecutive tokens: x = window[:-1], y = window[1:]. Windows cross
  document boundaries; the ``<|endoftext|>`` between documents is a token like any other.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from nanoattn.data.errors import DataError
from nanoattn.data.shards import SplitTokens, shard_name
from nanoattn.data.tokenizer import load_tokenizer
from nanoattn.validation import check_positive_int

SPLITS = ("train", "val")
_TRAIN_STREAM = 0x7261696E  # first word of every training seed, keeps this RNG stream apart from others


class TokenData:
    """A prepared folder (token shards, ``tokenizer.json``, ``meta.json``), read lazily."""

    def __init__(self, data_dir: str | Path) -> None:
        self.data_dir = Path(data_dir)
        meta_file = self.data_dir / "meta.json"
        if not meta_file.is_file():
            raise DataError(f"{self.data_dir}: no prepared data here (no meta.json); "
                            "run python scripts/prepare_data.py")
        self.meta: dict[str, Any] = json.loads(meta_file.read_text())
        self.tokenizer = load_tokenizer(self.data_dir / "tokenizer.json")
        self.vocab_size: int = self.meta["tokenizer"]["vocab_size"]
        self.eot_id: int = self.meta["tokenizer"]["eot_id"]
        self.bytes_per_token: float = self.meta["bytes_per_token"]
        self._dtype = np.dtype(self.meta["dtype"])
        self._tokens: dict[str, SplitTokens] = {}

    def check_tokenizer(self, tokenizer: Tokenizer, source: str | Path) -> None:
        """Refuse this data for a model or run whose tokenizer (from ``source``) is another one.

        Whole tokenizers are compared, not their sizes: another tokenizer's ids mean other tokens,
        so every loss and sample would be silently wrong.
        """
        if tokenizer.to_str() != self.tokenizer.to_str():
            raise ValueError(f"data folder {self.data_dir} holds another tokenizer than {source}: its token "
                             "ids would mean other tokens; use the data it was trained on")

    def open(self) -> None:
        """Memory-map every split now (else each is mapped on first use)."""
        for split in SPLITS:
            self.tokens(split)

    def tokens(self, split: str) -> SplitTokens:
        """All token ids of ``split`` ("train" or "val"), memory-mapped read-only: ``.size`` and slices."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is invalid: allowed: {' | '.join(SPLITS)}")
        if split not in self._tokens:
            sizes = self.meta.get("shards", {}).get(split)
            if sizes is None:
                raise DataError(f"{self.data_dir}: prepared by an older nanoattn (no shards in meta.json); "
                                "prepare again: python scripts/prepare_data.py")
            files = [self.data_dir / shard_name(split, i) for i in range(len(sizes))]
            self._tokens[split] = SplitTokens(files, sizes, self._dtype)
        return self._tokens[split]

    def train_batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, micro_step: int = 0,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, y), each int64 [batch_size, seq_len]: this rank's random training windows for this step."""
        for name, value in (("step", step), ("seed", seed), ("micro_step", micro_step), ("rank", rank)):
            check_non_negative_int(name, value)
        for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("world_size", world_size)):
            check_positive_int("train_batch", name, value)
        if rank >= world_size:
            raise ValueError(f"train_batch.rank={rank} is invalid: must be below world_size={world_size}")
        tokens = self.tokens("train")
        n_starts = _n_starts(tokens, seq_len, "train")
        if n_starts < batch_size * world_size:
            raise DataError(f"the train split has {n_starts:,} window starts for seq_len={seq_len}, fewer "
                            f"than the {batch_size * world_size} distinct windows of a global batch")
        rng = np.random.default_rng([_TRAIN_STREAM, seed, step, micro_step])
        starts = rng.choice(n_starts, size=batch_size * world_size, replace=False)
        return _windows(tokens, starts[rank * batch_size:(rank + 1) * batch_size], seq_len)

    def val_batches(self, n_batches: int, *, batch_size: int,
                    seq_len: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """``n_batches`` (x, y) pairs of int64 [batch_size, seq_len], evenly spaced over the val split."""
        check_positive_int("val_batches", "n_batches", n_batches)
        check_positive_int("val_batches", "batch_size", batch_size)
        check_positive_int("val_batches", "seq_len", seq_len)
        tokens = self.tokens("val")
        last_start = _n_starts(tokens, seq_len, "val") - 1
        starts = np.linspace(0, last_start, n_batches * batch_size).round().astype(np.int64)
        return [_windows(tokens, starts[i:i + batch_size], seq_len)
                for i in range(0, n_batches * batch_size, batch_size)]

    def sequential(self, split: str, length: int, stride: int | None = None) -> Iterator[np.ndarray]:
        """Windows of ``length + 1`` tokens (int64) walking ``split`` from its first token.

        Window k is ``tokens[k*stride : k*stride + length + 1]``: inputs ``w[:-1]``, targets ``w[1:]``.

        - ``stride=None`` (= ``length``): non-overlapping chunks. Consecutive windows share one
          token (the last target of one is the first input of the next), so every target appears
          in exactly one window; score all ``length`` targets of every window.
        - ``1 <= stride < length``: a sliding window. Score all targets of the first window and only
          the last ``stride`` targets of each later one; then every target is scored exactly once,
          and each after the first window sees at least ``length - stride`` tokens of context.

        Only whole windows are yielded: the last (fewer than ``stride``) tokens of the split,
        which no whole window reaches, are not scored. Raises DataError if the split is shorter
        than ``length + 1`` tokens.
        """
        check_positive_int("sequential", "length", length)
        stride = length if stride is None else stride
        check_positive_int("sequential", "stride", stride)
        if stride > length:
            raise ValueError(f"sequential.stride={stride} is invalid: must be at most length={length} "
                             "(a larger stride would skip tokens)")
        tokens = self.tokens(split)
        for start in range(0, _n_starts(tokens, length, split), stride):
            yield np.asarray(tokens[start:start + length + 1], dtype=np.int64)


def bits_per_byte(loss_nats: float, bytes_per_token: float) -> float:
    """A mean loss in nats per token as bits per UTF-8 byte: loss / ln 2 / bytes_per_token."""
    if not bytes_per_token > 0:
        raise ValueError(f"bytes_per_token={bytes_per_token!r} is invalid: must be positive")
    return loss_nats / math.log(2) / bytes_per_token


def _n_starts(tokens: SplitTokens, seq_len: int, split: str) -> int:
    """How many windows of ``seq_len + 1`` tokens fit; at least one, or a DataError."""
    if tokens.size < seq_len + 1:
        raise DataError(f"the {split} split has {tokens.size:,} tokens, too few for one window of "
                        f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or a larger {split} split")
    return tokens.size - seq_len


def _windows(tokens: SplitTokens, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = np.stack([tokens[s:s + seq_len + 1] for s in starts]).astype(np.int64)  # [B, T+1]
    batch = torch.from_numpy(rows)
    return batch[:, :-1].contiguous(), batch[:, 1:].contiguous()  # [B, T] each


def check_non_negative_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"train_batch.{name}={value!r} is invalid: must be a non-negative integer")
