"""Prepare a corpus into ``<root>/<name>/``: token shards, ``tokenizer.json`` and ``meta.json``.

Design choices:

- Up to date means: ``meta.json`` holds the fingerprint of the current config (every field but
  ``root``, which only says where), of this file format and of the sources (see
  ``corpora.source_stamp``; a ``file`` tokenizer's bytes too), and every shard it names exists. Then
  nothing is done. Anything else prepares anew.
- Streamed: documents are read as they come (a streamed corpus is never held in memory), encoded in
  parallel batches and written in fixed-size shards (``shards.write_split``), so memory is bounded
  whatever the corpus size.
- Everything is written into a hidden folder next to the target, ``.<name>.partial-<fingerprint>``,
  renamed into place when complete, so the target is always the previous complete folder (or none),
  never a half-written one. A preparation stopped at any instant, SIGKILL included, leaves that
  folder, and the next preparation of the same config resumes it: the tokenizer is the one saved
  there, finished shards are kept, the unfinished one is redone (byte-identical).
- One preparation at a time per data root: it holds the root's lock (``runtime.exclusive_lock``)
  and others wait, then find the folder up to date. Under the lock no other preparation is running,
  so a hidden folder of this name for another config is a stale one and is removed. SIGTERM (and
  Ctrl-C) raise inside the preparation, so it stops between two writes.
- Preparation deletes only what it writes: a folder holding anything but its own files (a run
  directory placed inside it, a user's notes) is refused, never replaced.
- A shard is a flat array of token ids, each document followed by ``<|endoftext|>``, in uint16 when
  the vocabulary fits and uint32 otherwise; ``loader.TokenData`` memory-maps the shards.
- A literal "<|endoftext|>" inside a document is encoded as plain text, so only the separators
  appended here are EOT tokens.
- ``bytes_per_token`` = UTF-8 bytes of the validation text / validation tokens, EOT tokens
  included because a mean loss averages over them too; so a mean validation loss of L nats per
  token is L / ln 2 / bytes_per_token bits per byte (``loader.bits_per_byte``).
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer
from tqdm import tqdm

from nanoattn.config import DataConfig
from nanoattn.data import corpora
from nanoattn.data.corpora import Corpus
from nanoattn.data.errors import DataError
from nanoattn.data.loader import TokenData
from nanoattn.data.shards import SplitProgress, shard_name, write_split
from nanoattn.data.tokenizer import build_tokenizer, eot_id, load_tokenizer, sample_texts, token_dtype
from nanoattn.runtime import exclusive_lock, write_atomic

FORMAT_VERSION = 2  # bump when the files written here change meaning, so old folders re-prepare
SPLITS = ("train", "val")
# What a prepared folder holds (format 1 wrote one train.bin and one val.bin): nothing else is ever
# replaced or deleted.
OWN_FILE = re.compile(r"(meta|tokenizer|(train|val)\.progress)\.json|(train|val)(-\d{6})?\.bin")


def data_dir(cfg: DataConfig) -> Path:
    """``<root>/<name>``, absolute; a relative root is taken from the current working directory."""
    return (Path(cfg.root).expanduser() / cfg.name).absolute()


def fingerprint(cfg: DataConfig) -> str:
    config = {k: v for k, v in cfg.to_dict().items() if k != "root"}
    sources: list[Any] = corpora.source_stamp(cfg)
    if cfg.tokenizer.type == "file":
        sources.append(hashlib.sha256(Path(cfg.tokenizer.path).expanduser().read_bytes()).hexdigest())
    blob = json.dumps({"format": FORMAT_VERSION, "config": config, "sources": sources}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


def is_up_to_date(cfg: DataConfig) -> bool:
    target = data_dir(cfg)
    try:
        meta = json.loads((target / "meta.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    listed = meta.get("shards", {})
    shards = [shard_name(split, i) for split in SPLITS for i in range(len(listed.get(split, [])))]
    return (meta.get("fingerprint") == fingerprint(cfg) and (target / "tokenizer.json").is_file()
            and all((target / name).is_file() for name in shards))


def ensure_prepared(cfg: DataConfig) -> Path:
    """The prepared folder, preparing it first (with progress and a summary) only when needed."""
    with preparation_lock(cfg) as up_to_date:
        return data_dir(cfg) if up_to_date else _prepare(cfg)


def open_prepared(cfg: DataConfig) -> TokenData:
    """The prepared data, preparing it first (with progress and a summary) only when needed.

    Both splits are memory-mapped under the lock: a later re-preparation by another run replaces
    the folder, but not the files this one holds open, nor its tokenizer.
    """
    with preparation_lock(cfg) as up_to_date:
        data = TokenData(data_dir(cfg) if up_to_date else _prepare(cfg))
        data.open()
        return data


def prepare_data(cfg: DataConfig, force: bool = False) -> Path:
    """Prepare ``cfg`` into ``data_dir(cfg)`` and print a summary; with the same config, say so and stop.
    ``force`` prepares anew from the first row, an interrupted preparation's shards discarded."""
    with preparation_lock(cfg) as up_to_date:
        if not force and up_to_date:
            target = data_dir(cfg)
            print(f"{target} is up to date with this config; nothing to do (force=true re-prepares)")
            return target
        if force:
            shutil.rmtree(partial_dir(cfg), ignore_errors=True)
        return _prepare(cfg)


def partial_dir(cfg: DataConfig) -> Path:
    """Where a preparation of ``cfg`` writes until it is complete (and where a killed one resumes)."""
    target = data_dir(cfg)
    return target.with_name(f".{target.name}.partial-{fingerprint(cfg)[:16]}")


@contextmanager
def preparation_lock(cfg: DataConfig) -> Iterator[bool]:
    """Hold the data root's lock (waiting for another preparation), with SIGTERM raising inside; yields
    whether the folder is up to date with ``cfg``, as found under the lock. Hidden folders of this name
    that no preparation of ``cfg`` resumes are a killed one's: removed (all of them when the folder is
    up to date: there is nothing to resume)."""
    target = data_dir(cfg)
    with exclusive_lock(target.parent, f"data root {target.parent}", wait=True), _sigterm_raises():
        up_to_date = is_up_to_date(cfg)
        resumable = None if up_to_date else partial_dir(cfg)
        for stage in ("partial", "old"):
            for leftover in target.parent.glob(f".{target.name}.{stage}-*"):
                if leftover != resumable:
                    shutil.rmtree(leftover, ignore_errors=True)
        yield up_to_date


@contextmanager
def _sigterm_raises() -> Iterator[None]:
    """SIGTERM as KeyboardInterrupt while preparing, so preparation stops between two writes."""
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
    held = sorted(p.name for p in target.iterdir()) if target.is_dir() else []
    foreign = [name for name in held if not OWN_FILE.fullmatch(name)]
    if foreign:
        raise DataError(f"{target} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}, "
                        "which preparation did not write: it never replaces such a folder; move them "
                        "out or choose another data.name")


def _prepare(cfg: DataConfig) -> Path:
    target, partial = data_dir(cfg), partial_dir(cfg)
    _check_owned(target)
    started = time.perf_counter()
    corpus = corpora.load_corpus(cfg)
    partial.mkdir(parents=True, exist_ok=True)
    tokenizer = _tokenizer(cfg, corpus, partial)
    dtype = token_dtype(tokenizer.get_vocab_size())
    tokenizer.encode_special_tokens = True  # a literal "<|endoftext|>" in a document is just text
    splits = {}
    for split, docs in (("train", corpus.train), ("val", corpus.val)):
        with tqdm(desc=f"encoding {split}", unit="char", unit_scale=True, leave=False) as bar:
            splits[split] = write_split(partial, split, docs, tokenizer, eot_id(tokenizer), dtype,
                                        cfg.shard_tokens, on_rows=bar.update)
    meta = _meta(cfg, corpus, tokenizer, dtype, splits, time.perf_counter() - started)
    (partial / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    _check_owned(target)  # again: something may have been put there while preparing
    retired = target.with_name(partial.name.replace(".partial-", ".old-", 1))
    if target.exists():
        target.rename(retired)
    partial.rename(target)
    shutil.rmtree(retired, ignore_errors=True)
    print(summary(target, meta))
    return target


def _tokenizer(cfg: DataConfig, corpus: Corpus, partial: Path) -> Tokenizer:
    """The tokenizer an interrupted preparation saved in ``partial``, or a new one saved there."""
    saved = partial / "tokenizer.json"
    if saved.is_file():
        return load_tokenizer(saved)
    if cfg.tokenizer.type in ("bpe", "char"):
        print(f"building the {cfg.tokenizer.type} tokenizer from the first {cfg.tokenizer.sample_chars:,} "
              "characters of the training split")
    tokenizer = build_tokenizer(cfg.tokenizer, sample_texts((d.text for d in corpus.train),
                                                            cfg.tokenizer.sample_chars))
    write_atomic(saved, tokenizer.to_str(pretty=True))  # a kill mid-write leaves none, never half of one
    return tokenizer


def _meta(cfg: DataConfig, corpus: Corpus, tokenizer: Tokenizer, dtype: np.dtype,
          splits: dict[str, SplitProgress], seconds: float) -> dict[str, Any]:
    return {
        "format": FORMAT_VERSION,
        "fingerprint": fingerprint(cfg),
        "config": cfg.to_dict(),
        "corpus": {
            "source": corpus.source,
            "validation": corpus.validation,
            "val_documents": splits["val"].names,
            "documents": {s: p.documents for s, p in splits.items()},
            "characters": {s: p.characters for s, p in splits.items()},
            "bytes": {s: p.bytes for s, p in splits.items()},
        },
        "tokenizer": {"type": cfg.tokenizer.type, "vocab_size": tokenizer.get_vocab_size(),
                      "eot_id": eot_id(tokenizer)},
        "dtype": dtype.name,
        "tokens": {s: p.tokens for s, p in splits.items()},
        "shards": {s: p.shards for s, p in splits.items()},
        "bytes_per_token": splits["val"].bytes / splits["val"].tokens,
        "seconds": round(seconds, 2),
    }


def summary(target: Path, meta: dict[str, Any]) -> str:
    """The human-readable account of a prepared folder, as printed after preparing it."""
    c, tok = meta["corpus"], meta["tokenizer"]
    rows = [f"{split:<6}{c['documents'][split]:>10,}{c['characters'][split]:>14,}{meta['tokens'][split]:>14,}"
            f"{len(meta['shards'][split]):>8,}" for split in SPLITS]
    return "\n".join([
        f"prepared {target} in {meta['seconds']:.1f} s",
        f"  source      {c['source']}",
        f"  validation  {c['validation']}",
        f"  tokenizer   {tok['type']}, vocab {tok['vocab_size']:,}, ids stored as {meta['dtype']}",
        f"  {'':<6}{'documents':>10}{'characters':>14}{'tokens':>14}{'shards':>8}",
        *("  " + row for row in rows),
        f"  bytes/token (val) {meta['bytes_per_token']:.4f}",
    ])
