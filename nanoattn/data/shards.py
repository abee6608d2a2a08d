"""Token shards: fixed-size files of token ids, written resumably, read back as one sequence per split.

Design choices:

- A split is a list of shard files ``<split>-000000.bin``, ``<split>-000001.bin``, ...; every shard but
  the split's last holds exactly ``shard_tokens`` ids. Documents run across shard boundaries as they
  run across training windows.
- The writer holds one shard's buffer and one batch of rows at a time, so its memory does not grow
  with the corpus.
- Resume: after each finished shard, ``<split>.progress.json`` records where the next one starts (the
  row, and how many of that row's ids are already written) with the split's running statistics. The
  shard is renamed into place before the record names it, so a record never names an unfinished
  shard. A preparation killed at any instant starts again from its record: finished shards are
  never rewritten, the unfinished one is redone from its first row, and because the rows, the
  tokenizer and the rule are the same, the shards come out byte-identical to an uninterrupted run.
- Reading: ``SplitTokens`` memory-maps the shards and answers ``.size``, ``len()`` and slices, a slice
  across a boundary being the two pieces joined, so windows and walks read a sharded split exactly as
  they would read one file.
"""

from __future__ import annotations

import bisect
import dataclasses
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from nanoattn.data.corpora import Document
from nanoattn.data.errors import DataError
from nanoattn.runtime import write_atomic

ENCODE_BATCH_CHARS = 1 << 20  # rows are encoded in parallel batches of about this many characters
MAX_LISTED_DOCUMENTS = 100  # a split's statistics name its documents up to this many


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}.bin"


@dataclass
class SplitProgress:
    """How far a split's shards are written, and its statistics up to there."""

    shards: list[int] = dataclasses.field(default_factory=list)  # ids in each finished shard
    next_row: int = 0  # the first row not wholly written
    offset: int = 0  # how many of that row's ids (its EOT included) are written
    documents: int = 0
    characters: int = 0
    bytes: int = 0
    names: list[str] = dataclasses.field(default_factory=list)  # the first MAX_LISTED_DOCUMENTS
    done: bool = False

    @classmethod
    def load(cls, folder: Path, split: str) -> SplitProgress:
        record = folder / f"{split}.progress.json"
        return cls(**json.loads(record.read_text())) if record.is_file() else cls()

    def save(self, folder: Path, split: str) -> None:
        write_atomic(folder / f"{split}.progress.json", json.dumps(dataclasses.asdict(self)) + "\n")

    @property
    def tokens(self) -> int:
        return sum(self.shards)


def write_split(folder: Path, split: str, rows: Iterable[Document], tokenizer: Tokenizer, eot: int,
                dtype: np.dtype, shard_tokens: int, on_rows=None) -> SplitProgress:
    """Encode ``rows`` (each followed by ``eot``) into ``folder``'s shards of ``split``, resuming from
    its progress record; returns the finished split's record. ``on_rows(n_chars)`` follows progress."""
    progress = SplitProgress.load(folder, split)
    if progress.done:
        return progress
    buffer = np.empty(shard_tokens, dtype=dtype)
    filled, row = 0, progress.next_row
    for batch in _batches(_rows_from(rows, progress.next_row), ENCODE_BATCH_CHARS):
        encodings = tokenizer.encode_batch([doc.text for _, doc in batch])  # parallel in Rust
        for (row, doc), encoding in zip(batch, encodings, strict=True):
            ids = np.fromiter((*encoding.ids, eot), dtype=dtype)
            at = progress.offset if row == progress.next_row else 0
            if at == 0:
                _count(progress, doc)
            while at < ids.size:
                take = min(ids.size - at, shard_tokens - filled)
                buffer[filled:filled + take] = ids[at:at + take]
                filled, at = filled + take, at + take
                if filled == shard_tokens:
                    progress.next_row, progress.offset = (row + 1, 0) if at == ids.size else (row, at)
                    _finish_shard(folder, split, buffer, progress)
                    filled = 0
        if on_rows is not None:
            on_rows(sum(len(doc.text) for _, doc in batch))
    if filled:  # the split's last shard, ending with its last row
        progress.next_row, progress.offset = row + 1, 0
        _finish_shard(folder, split, buffer[:filled], progress)
    if not progress.shards:
        raise DataError(f"the {split} split has no documents")
    progress.done = True
    progress.save(folder, split)
    return progress


def _rows_from(rows: Iterable[Document], first: int) -> Iterator[tuple[int, Document]]:
    """(row, document) from row ``first`` on: the rows before it are read and passed over, not encoded."""
    for row, doc in enumerate(rows):
        if row >= first:
            yield row, doc


def _batches(rows: Iterator[tuple[int, Document]], max_chars: int) -> Iterator[list[tuple[int, Document]]]:
    batch: list[tuple[int, Document]] = []
    chars = 0
    for item in rows:
        batch.append(item)
        chars += len(item[1].text)
        if chars >= max_chars:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


def _count(progress: SplitProgress, doc: Document) -> None:
    progress.documents += 1
    progress.characters += len(doc.text)
    progress.bytes += len(doc.text.encode())
    if len(progress.names) < MAX_LISTED_DOCUMENTS:
        progress.names.append(doc.name)


def _finish_shard(folder: Path, split: str, ids: np.ndarray, progress: SplitProgress) -> None:
    write_atomic(folder / shard_name(split, len(progress.shards)), ids.tobytes())
    progress.shards.append(int(ids.size))
    progress.save(folder, split)


class SplitTokens:
    """A split's shards, memory-mapped read-only, as one sequence of token ids."""

    def __init__(self, files: Sequence[Path], sizes: Sequence[int], dtype: np.dtype) -> None:
        self._parts = []
        for file, expected in zip(files, sizes, strict=True):
            ids = np.memmap(file, dtype=dtype, mode="r")
            if ids.size != expected:
                raise DataError(f"{file}: {ids.size} tokens where meta.json says {expected}; "
                                "prepare again with force=true")
            self._parts.append(ids)
        self._starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64).tolist()
        self.size: int = self._starts[-1]
        self.dtype = np.dtype(dtype)

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: slice) -> np.ndarray:
        if not isinstance(index, slice):
            raise TypeError(f"a split's tokens are read in slices, not by {type(index).__name__}")
        start, stop, step = index.indices(self.size)
        if step != 1:
            raise ValueError(f"a split's tokens are read in contiguous slices, not with step {step}")
        if len(self._parts) == 1:
            return self._parts[0][start:stop]
        pieces = []
        while start < stop:
            part = bisect.bisect_right(self._starts, start) - 1
            end = min(stop, self._starts[part + 1])
            base = self._starts[part]
            pieces.append(self._parts[part][start - base:end - base])
            start = end
        return np.concatenate(pieces) if len(pieces) != 1 else pieces[0]
