"""Prepare a corpus into ``<root>/<name>/``: ``train.bin``, ``val.bin``, ``tokenizer.json``, ``meta.json``.

Design choices:

- Up to date means: ``meta.json`` holds the fingerprint of the current config (every field but
  ``root``, which only says where), of this file format and of the sources (see
  ``corpora.source_stamp``), and the other three files exist. Then nothing is done. Anything else
  re-prepares from scratch: the corpora are small, and partial updates are where staleness bugs live.
- Everything is written into a hidden temporary folder next to the target and renamed into place
  at the end, so an interrupted run leaves the previous complete folder (or none), never a
  half-written one. The previous folder is moved aside before the rename and deleted after it.
- One preparation at a time per data root: it holds the root's lock (``runtime.exclusive_lock``)
  and others wait, then find the folder up to date. Under the lock no other preparation can be
  running, so any leftover staging folder is a killed one's and is removed. SIGTERM (and Ctrl-C)
  raise inside the preparation, so its staging folder is removed on the way out.
- Preparation deletes only what it writes: a folder holding anything but its four files (a run
  directory placed inside it, a user's notes) is refused, never replaced.
- A ``.bin`` file is a flat array of token ids, each document followed by ``<|endoftext|>``, in
  uint16 when the vocabulary fits and uint32 otherwise; ``loader.TokenData`` memory-maps it.
- A literal "<|endoftext|>" inside a document is encoded as plain text, so only the separators
  appended here are EOT tokens.
- ``bytes_per_token`` = UTF-8 bytes of the validation text / validation tokens, EOT tokens
  included because a mean loss averages over them too; so a mean validation loss of L nats per
  token is L / ln 2 / bytes_per_token bits per byte (``loader.bits_per_byte``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from nanoattn.config import DataConfig
from nanoattn.data import corpora
from nanoattn.data.corpora import Corpus, Document
from nanoattn.data.errors import DataError
from nanoattn.data.loader import TokenData
from nanoattn.data.tokenizer import build_tokenizer, eot_id, token_dtype
from nanoattn.runtime import exclusive_lock

FORMAT_VERSION = 1  # bump when the files written here change meaning, so old folders re-prepare
FILES = ("train.bin", "val.bin", "tokenizer.json", "meta.json")
ENCODE_CHUNK_CHARS = 1 << 20  # documents are encoded in parallel batches of about this many characters
MAX_LISTED_DOCUMENTS = 100  # meta.json names the validation documents up to this many


def data_dir(cfg: DataConfig) -> Path:
    """``<root>/<name>``, absolute; a relative root is taken from the current working directory."""
    return (Path(cfg.root).expanduser() / cfg.name).absolute()


def fingerprint(cfg: DataConfig) -> str:
    config = {k: v for k, v in cfg.to_dict().items() if k != "root"}
    blob = json.dumps({"format": FORMAT_VERSION, "config": config, "sources": corpora.source_stamp(cfg)},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def is_up_to_date(cfg: DataConfig) -> bool:
    target = data_dir(cfg)
    if not all((target / f).is_file() for f in FILES):
        return False
    try:
        meta = json.loads((target / "meta.json").read_text())
    except json.JSONDecodeError:
        return False
    return meta.get("fingerprint") == fingerprint(cfg)


def ensure_prepared(cfg: DataConfig) -> Path:
    """The prepared folder, preparing it first (with progress and a summary) only when needed."""
    with preparation_lock(cfg):
        return _ensure(cfg)


def open_prepared(cfg: DataConfig) -> TokenData:
    """The prepared data, preparing it first (with progress and a summary) only when needed.

    Both splits are memory-mapped under the lock: a later re-preparation by another run replaces
    the folder, but not the files this one holds open, nor its tokenizer.
    """
    with preparation_lock(cfg):
        data = TokenData(_ensure(cfg))
        data.open()
        return data


def _ensure(cfg: DataConfig) -> Path:
    return data_dir(cfg) if is_up_to_date(cfg) else _prepare(cfg)


def prepare_data(cfg: DataConfig, force: bool = False) -> Path:
    """Prepare ``cfg`` into ``data_dir(cfg)`` and print a summary; with the same config, say so and stop."""
    with preparation_lock(cfg):
        if not force and is_up_to_date(cfg):
            target = data_dir(cfg)
            print(f"{target} is up to date with this config; nothing to do (force=true re-prepares)")
            return target
        return _prepare(cfg)


@contextmanager
def preparation_lock(cfg: DataConfig) -> Iterator[None]:
    """Hold the data root's lock (waiting for another preparation), with SIGTERM raising inside."""
    target = data_dir(cfg)
    with exclusive_lock(target.parent, f"data root {target.parent}", wait=True), _sigterm_raises():
        for stage in ("tmp", "old"):  # _staging's folders
            for leftover in target.parent.glob(f".{target.name}.{stage}-*"):
                shutil.rmtree(leftover, ignore_errors=True)
        yield


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM as KeyboardInterrupt while preparing, so the staging folder is cleaned up."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} while preparing data")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _check_owned(target: Path) -> None:
    foreign = sorted(p.name for p in target.iterdir() if p.name not in FILES) if target.is_dir() else []
    if foreign:
        raise DataError(f"{target} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, "
                        "which preparation did not write: it never replaces such a folder; move them "
                        "out or choose another data.name")


def _prepare(cfg: DataConfig) -> Path:
    target = data_dir(cfg)
    _check_owned(target)
    started = time.perf_counter()
    corpus = corpora.load_corpus(cfg)
    print(f"building the {cfg.tokenizer.type} tokenizer from {len(corpus.train)} training documents")
    tokenizer = build_tokenizer(cfg.tokenizer, [d.text for d in corpus.train])
    dtype = token_dtype(tokenizer.get_vocab_size())
    with _staging(target) as tmp:
        tokens = {split: _write_tokens(tokenizer, docs, tmp / f"{split}.bin", dtype)
                  for split, docs in (("train", corpus.train), ("val", corpus.val))}
        tokenizer.save(str(tmp / "tokenizer.json"))
        meta = _meta(cfg, corpus, tokenizer, dtype, tokens, time.perf_counter() - started)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(summary(target, meta))
    return target


@contextmanager
def _staging(target: Path) -> Iterator[Path]:
    """A hidden folder next to ``target`` that becomes ``target`` if the block completes."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the prepared folder should read like any other
    retired = tmp.with_name(tmp.name.replace(".tmp-", ".old-", 1))
    try:
        yield tmp
        _check_owned(target)  # again: something may have been put there while preparing
        if target.exists():
            target.rename(retired)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(retired, ignore_errors=True)


def _write_tokens(tokenizer: Tokenizer, docs: Sequence[Document], path: Path, dtype: np.dtype) -> int:
    """Encode ``docs`` into ``path``, EOT after each; returns the number of tokens written."""
    eot = eot_id(tokenizer)
    tokenizer.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is just text
    written = 0
    with open(path, "wb") as out, tqdm(total=sum(len(d.text) for d in docs), desc=f"encoding {path.stem}",
                                       unit="char", unit_scale=True, leave=False) as bar:
        for chunk in _chunks(docs, ENCODE_CHUNK_CHARS):
            for encoding in tokenizer.encode_batch([d.text for d in chunk]):  # parallel in Rust
                ids = np.array([*encoding.ids, eot], dtype=dtype)
                ids.tofile(out)
                written += ids.size
            bar.update(sum(len(d.text) for d in chunk))
    return written


def _chunks(docs: Sequence[Document], max_chars: int) -> Iterator[list[Document]]:
    chunk: list[Document] = []
    chars = 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc.text)
        if chars >= max_chars:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def _meta(cfg: DataConfig, corpus: Corpus, tokenizer: Tokenizer, dtype: np.dtype,
          tokens: dict[str, int], seconds: float) -> dict[str, Any]:
    splits = {"train": corpus.train, "val": corpus.val}
    utf8_bytes = {s: sum(len(d.text.encode()) for d in docs) for s, docs in splits.items()}
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint(cfg),
        "config": cfg.to_dict(),
        "corpus": {
            "source": corpus.source,
            "validation": corpus.validation,
            "val_documents": [d.name for d in corpus.val[:MAX_LISTED_DOCUMENTS]],
            "documents": {s: len(docs) for s, docs in splits.items()},
            "characters": {s: sum(len(d.text) for d in docs) for s, docs in splits.items()},
            "bytes": utf8_bytes,
        },
        "tokenizer": {"type": cfg.tokenizer.type, "vocab_size": tokenizer.get_vocab_size(),
                      "eot_id": eot_id(tokenizer)},
        "dtype": dtype.name,
        "tokens": tokens,
        "bytes_per_token": utf8_bytes["val"] / tokens["val"],
        "seconds": round(seconds, 2),
    }


def summary(target: Path, meta: dict[str, Any]) -> str:
    """The human-readable account of a prepared folder, as printed after preparing it."""
    c, tok = meta["corpus"], meta["tokenizer"]
    rows = [f"{split:<6}{c['documents'][split]:>10,}{c['characters'][split]:>14,}{meta['tokens'][split]:>14,}"
            for split in ("train", "val")]
    return "\n".join([
        f"prepared {target} in {meta['seconds']:.1f} s",
        f"  source      {c['source']}",
        f"  validation  {c['validation']}",
        f"  tokenizer   {tok['type']}, vocab {tok['vocab_size']:,}, ids stored as {meta['dtype']}",
        f"  {'':<6}{'documents':>10}{'characters':>14}{'tokens':>14}",
        *("  " + row for row in rows),
        f"  bytes/token (val) {meta['bytes_per_token']:.4f}",
    ])
