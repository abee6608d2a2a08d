"""Streamed preparation measured: peak memory at corpus sizes 10x apart, and a SIGKILL mid-shard resumed.

- Each preparation is a process of its own (``prepare_data`` of a ``rows`` corpus, shard size and
  tokenizer fixed), so the peak resident memory ``os.wait4`` reports is that preparation's alone,
  the interpreter and its imports included. The corpora are JSON lines of seeded words
  (``write_rows_corpus``), so what could grow with the corpus is only what preparation keeps.
- The kill: a preparation of the largest corpus is SIGKILLed once its partial folder holds
  ``kill_after_shards`` finished shards (so mid-way through the next), then run again to the end;
  its shards are compared byte for byte with the uninterrupted preparation's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanoattn.config import DataConfig, TokenizerConfig
from nanoattn.data.prepare import partial_dir
from nanoattn.data.shards import SplitProgress
from nanoattn.eval.results import check_page_output, header_lines, provenance, write_page
from nanoattn.eval.tables import format_table
from nanoattn.validation import check_positive_int, fail

ABOUT = ("Streamed corpus preparation (`data.corpus=rows`: JSON lines read as a stream, encoded in "
         "batches, written in fixed-size shards): each preparation's peak resident memory at corpus "
         "sizes 10x apart, and a preparation SIGKILLed mid-shard and run again, its shards compared byte "
         "for byte with an uninterrupted one's. The first row is the interpreter with preparation's "
         "imports and nothing prepared. Rules: nanoattn/bench/prepare.py.")
SYLLABLES = ("ka", "lo", "mi", "ter", "sun", "va", "ne", "do", "ri", "pal", "qu", "es", "th", "ow", "bi")
# A child process that prepares one corpus (the config arrives as JSON), or with "null" only imports.
PREPARE = ("import json, sys, datasets; from nanoattn.config import DataConfig; "
           "from nanoattn.data import prepare_data; cfg = json.loads(sys.argv[1]); "
           "cfg is None or prepare_data(DataConfig.from_dict(cfg))")


@dataclass
class PrepareBenchConfig:
    """``python scripts/bench_prepare.py``: what is measured, and where the page goes."""

    sizes_mb: list[int] = dataclasses.field(default_factory=lambda: [4, 40])  # corpus sizes, JSON-lines MB
    shard_tokens: int = 1_000_000
    kill_after_shards: int = 3  # the kill comes once this many train shards are finished
    out: str | None = None  # None: runs/bench_prepare; docs/results publishes the page

    def __post_init__(self) -> None:
        own = "bench_prepare"
        if not isinstance(self.sizes_mb, (list, tuple)) or not self.sizes_mb:
            fail(own, "sizes_mb", self.sizes_mb, "must be a non-empty list of positive integers")
        for size in self.sizes_mb:
            check_positive_int(own, "sizes_mb", size)
        self.sizes_mb = list(self.sizes_mb)
        check_positive_int(own, "shard_tokens", self.shard_tokens)
        check_positive_int(own, "kill_after_shards", self.kill_after_shards)


def write_rows_corpus(path: Path, n_bytes: int, seed: int = 0) -> int:
    """JSON lines ``{"text": ...}`` of seeded words (2,000 made of syllables, enough for BPE to keep
    merging), about ``n_bytes`` long; the number of rows."""
    rng = random.Random(seed)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(2000)]
    written = rows = 0
    with open(path, "w") as out:
        while written < n_bytes:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(20, 400)))
            line = json.dumps({"text": text}) + "\n"
            out.write(line)
            written, rows = written + len(line), rows + 1
    return rows


def rows_config(corpus: Path, root: Path, name: str, shard_tokens: int) -> DataConfig:
    return DataConfig(name=name, corpus="rows", paths=[str(corpus)], root=str(root),
                      shard_tokens=shard_tokens,
                      tokenizer=TokenizerConfig(type="bpe", vocab_size=512, sample_chars=1_000_000))


def start_preparation(cfg: DataConfig | None) -> subprocess.Popen:
    """A process preparing ``cfg`` (None: importing what preparation imports, preparing nothing)."""
    return subprocess.Popen([sys.executable, "-c", PREPARE, json.dumps(cfg and cfg.to_dict())],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def wait_measured(process: subprocess.Popen) -> tuple[int, float]:
    """(exit status, peak resident MB) of a started preparation, waited for."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_maxrss / 1024  # ru_maxrss is in KB on Linux


def kill_mid_shard(cfg: DataConfig, after_shards: int) -> int:
    """Start preparing ``cfg``, SIGKILL it once ``after_shards`` train shards are finished; how many were."""
    process = start_preparation(cfg)
    partial = partial_dir(cfg)
    while process.poll() is None:
        if len(SplitProgress.load(partial, "train").shards) >= after_shards:
            process.send_signal(signal.SIGKILL)
            process.wait()
            return len(SplitProgress.load(partial, "train").shards)
        time.sleep(0.01)
    raise RuntimeError(f"the preparation ended (exit status {process.returncode}) before {after_shards} "
                       "shards: give a larger corpus or smaller shards")


def same_shards(a: Path, b: Path) -> bool:
    names = sorted(p.name for p in a.glob("*-*.bin"))
    return names == sorted(p.name for p in b.glob("*-*.bin")) and all(
        (a / n).read_bytes() == (b / n).read_bytes() for n in names)


def run_prepare_bench(cfg: PrepareBenchConfig) -> list[dict[str, Any]]:
    """Measure every size, then the kill and resume on the largest; write the page. The rows."""
    out = Path(cfg.out or "runs/bench_prepare")
    check_page_output(out, "prepare", "bench_prepare.out")
    _, peak = wait_measured(start_preparation(None))
    rows: list[dict[str, Any]] = [{"corpus MB": 0, "rows": 0, "tokens": 0, "shards": 0,
                                   "peak MB": round(peak, 1), "seconds": None}]
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        for size in cfg.sizes_mb:
            corpus = scratch / f"corpus{size}.jsonl"
            n_rows = write_rows_corpus(corpus, size * 2**20)
            data = rows_config(corpus, scratch / "data", f"c{size}", cfg.shard_tokens)
            started = time.perf_counter()
            status, peak = wait_measured(start_preparation(data))
            if status != 0:
                raise RuntimeError(f"preparing {corpus} failed (exit status {status})")
            meta = json.loads((scratch / "data" / data.name / "meta.json").read_text())
            rows.append({"corpus MB": size, "rows": n_rows, "tokens": sum(meta["tokens"].values()),
                         "shards": sum(len(s) for s in meta["shards"].values()),
                         "peak MB": round(peak, 1), "seconds": round(time.perf_counter() - started, 1)})
            print(rows[-1], flush=True)
        killed = dataclasses.replace(data, root=str(scratch / "killed"))
        finished = kill_mid_shard(killed, cfg.kill_after_shards)
        status, peak = wait_measured(start_preparation(killed))
        identical = status == 0 and same_shards(scratch / "killed" / data.name, scratch / "data" / data.name)
        rows.append({"corpus MB": cfg.sizes_mb[-1], "killed after shards": finished,
                     "resumed peak MB": round(peak, 1), "byte-identical": identical})
    page = {**provenance("prepare", "Streamed preparation", ABOUT), "settings": dataclasses.asdict(cfg),
            "rows": rows}
    write_page(out, page, render=render_prepare, key="bench_prepare.out")
    return rows


def render_prepare(page: Mapping[str, Any]) -> str:
    measured = [r for r in page["rows"] if "peak MB" in r]
    resumed = [r for r in page["rows"] if "byte-identical" in r]
    return "\n".join([*header_lines(page), "", "## Peak memory by corpus size", "", _table(measured),
                      "## SIGKILL mid-shard, then resumed", "", _table(resumed)])


def _table(rows: list[Mapping[str, Any]]) -> str:
    columns = list(rows[0])
    return format_table(columns, ([f"{r[c]:,}" if isinstance(r[c], int) and not isinstance(r[c], bool)
                                   else "" if r[c] is None else str(r[c]) for c in columns] for r in rows))
