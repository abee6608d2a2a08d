"""Metrics sinks behind one small interface: ``log(record)`` and ``close()``.

Design choices:
- A record is a flat dict with a ``step``; the training loop writes one per log window (and one
  per evaluation), and every sink receives the same dict.
- ``metrics.jsonl`` is always written, one JSON object per line, flushed per line, so a run killed
  at any instant leaves complete lines (at most a torn last one, which ``truncate_metrics`` drops).
- The console shows a tqdm progress bar (loss, tokens/s, ETA) on a terminal and plain lines
  elsewhere (a log file full of carriage returns helps nobody).
- wandb is imported only when asked for. When the user is not logged in, or is but the server is
  unreachable, it runs offline with its files under ``<run dir>/wandb`` and prints how to sync.
  Any wandb exception is reported once and turns wandb off: a dashboard never stops a training.
- ``note`` prints a line without breaking the progress bar; it is how the library talks to users.
"""

from __future__ import annotations

import json
import math
import netrc
import os
import secrets
import socket
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import urlparse

from tqdm import tqdm

from nanoattn.config import LoggerConfig
from nanoattn.runtime import note, write_atomic
from nanoattn.validation import is_int

T = TypeVar("T")


class Logger(Protocol):
    def log(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._file = open(self.path, "a", encoding="utf-8")

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record, allow_nan=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, each a JSON object with an integer ``step``.

    A last line without its newline is a record torn by a kill and is skipped; anything else
    that is not such a record is corruption, refused in one line naming the file and the line.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is unreadable: {e}") from None
    lines = text.split("\n")
    records = []
    for number, line in enumerate(lines, start=1):
        torn = number == len(lines)  # after the last newline: empty, or a record cut short
        try:
            record = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            if torn:
                break
            raise ValueError(f"{path}:{number} is not JSON (one JSON object a line)") from None
        if record is None and torn:
            break
        if not isinstance(record, dict) or not is_int(record.get("step")):
            raise ValueError(f"{path}:{number} is not a metrics record (a JSON object with an integer step)")
        records.append(record)
    return records


def training_seconds(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """The seconds a run had trained by each of its metrics records: every log window's tokens over
    its tok_per_s, summed, so evaluations, checkpoints and the time between a kill and its resumption
    are left out."""
    seconds, tokens, out = 0.0, 0, []
    for record in records:
        if record.get("tok_per_s", 0) > 0:
            seconds += (record["tokens"] - tokens) / record["tok_per_s"]
            tokens = record["tokens"]
        out.append(seconds)
    return out


def truncate_metrics(path: str | Path, step: int) -> None:
    """Keep only the records up to ``step`` (a resumed run rewrites what follows), atomically."""
    path = Path(path)
    if not path.exists():
        return
    kept = [r for r in read_metrics(path) if r["step"] <= step]
    write_atomic(path, "".join(json.dumps(r, allow_nan=True) + "\n" for r in kept))


def with_progress(items: Sequence[T], what: str) -> Iterator[T]:
    """Each of ``items`` in turn, with a bar (rate, ETA) on a terminal; elsewhere a line as each is
    done: ``<what>: k/n done in <time>, ETA <time>`` at the rate so far."""
    if sys.stderr.isatty():
        yield from tqdm(items, desc=what, file=sys.stderr, dynamic_ncols=True, leave=False)
        return
    began = time.perf_counter()
    for done, item in enumerate(items, 1):
        yield item
        elapsed = time.perf_counter() - began
        note(f"{what}: {done}/{len(items)} done in {duration_text(elapsed)}, "
             f"ETA {duration_text(elapsed / done * (len(items) - done))}")


def duration_text(seconds: float) -> str:
    """``1h02m``, ``3m05s`` or ``42s``."""
    m, s = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def _fmt(value: float) -> str:
    return f"{value:.4f}" if math.isfinite(value) else str(value)


class ConsoleLogger:
    """A progress bar with its rate and ETA on a terminal; elsewhere (a log file, a lab's run) a line a
    record, with the step of the total and the ETA at the rate so far."""

    def __init__(self, total_steps: int, initial_step: int = 0) -> None:
        self._bar = tqdm(total=total_steps, initial=initial_step, unit="step", dynamic_ncols=True,
                         file=sys.stderr) if sys.stderr.isatty() else None
        self._step = self._first = initial_step
        self._total, self._began = total_steps, time.perf_counter()

    def log(self, record: dict[str, Any]) -> None:
        step = record["step"]
        val = (f"val_loss {_fmt(record['val_loss'])}, val_bpb {_fmt(record['val_bpb'])}"
               if "val_loss" in record else "")
        if self._bar is None:
            train = (f"train_loss {_fmt(record['train_loss'])}, lr {record['lr']:.2e}, "
                     f"{record['tok_per_s']:,.0f} tok/s" if "train_loss" in record else "")
            done = step - self._first
            left = (time.perf_counter() - self._began) / done * (self._total - step) if done > 0 else None
            where = f"step {step}/{self._total} ({step / self._total:.0%}" + (
                f", ETA {duration_text(left)})" if left is not None else ")")
            note(f"{where}: " + "; ".join(part for part in (train, val) if part))
            return
        if val:
            note(f"step {step}: {val}")
        if "train_loss" in record:
            self._bar.set_postfix_str(f"loss {_fmt(record['train_loss'])}, {record['tok_per_s']:,.0f} tok/s",
                                      refresh=False)
        self._bar.update(step - self._step)
        self._step = step

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _wandb_host() -> str:
    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"


def _logged_in(host: str) -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def _reachable(host: str, timeout: float = 3.0) -> bool:
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def wandb_mode() -> str:
    """WANDB_MODE when set; else "online" if logged in and the server answers, "offline" otherwise."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    host = _wandb_host()
    return "online" if _logged_in(host) and _reachable(host) else "offline"


class WandbLogger:
    """wandb, never fatal: the first exception is printed once and wandb is switched off."""

    def __init__(self, cfg: LoggerConfig, run_dir: Path, config: dict[str, Any]) -> None:
        self._run = None
        try:
            import wandb

            mode = wandb_mode()
            id_file = run_dir / "wandb" / "run_id"  # the same wandb run across resumes
            id_file.parent.mkdir(parents=True, exist_ok=True)
            if not id_file.exists():
                id_file.write_text(secrets.token_hex(4) + "\n")
            self._run = wandb.init(project=cfg.project, entity=cfg.entity, name=cfg.name or run_dir.name,
                                   tags=cfg.tags, config=config, dir=str(run_dir), mode=mode,
                                   id=id_file.read_text().strip(), resume="allow",
                                   settings=wandb.Settings(console="off"))
            # Our step is a metric, not wandb's internal counter, so the steps a resumed run
            # repeats are kept instead of being dropped as "not monotonically increasing".
            self._run.define_metric("step")
            self._run.define_metric("*", step_metric="step")
            if mode == "offline":
                note(f"wandb: offline run in {Path(self._run.dir).parent}; upload it with: "
                     f"wandb sync {Path(self._run.dir).parent}")
        except ModuleNotFoundError:
            note("wandb: not installed (pip install -e '.[wandb]'); training goes on, metrics.jsonl complete")
        except Exception as e:  # any wandb failure must leave training running
            self._fail(e)

    def _fail(self, e: Exception) -> None:
        first = (str(e).splitlines() or [""])[0][:200]
        note(f"wandb: disabled after an error ({type(e).__name__}: {first}); metrics.jsonl is complete")
        self._run = None

    def log(self, record: dict[str, Any]) -> None:
        if self._run is None:
            return
        try:
            self._run.log(record)
        except Exception as e:
            self._fail(e)

    def close(self) -> None:
        if self._run is None:
            return
        try:
            self._run.finish()
        except Exception as e:
            self._fail(e)


class Loggers:
    """Fan-out to several loggers."""

    def __init__(self, loggers: list[Logger]) -> None:
        self.loggers = loggers

    def log(self, record: dict[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(record)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


def make_logger(cfg: LoggerConfig, run_dir: str | Path, *, config: dict[str, Any], total_steps: int,
                initial_step: int = 0) -> Loggers:
    """metrics.jsonl, plus the console unless cfg.type is none, plus wandb when cfg.type is wandb."""
    run_dir = Path(run_dir)
    loggers: list[Logger] = [JsonlLogger(run_dir / "metrics.jsonl")]
    if cfg.type != "none":
        loggers.append(ConsoleLogger(total_steps, initial_step))
    if cfg.type == "wandb":
        loggers.append(WandbLogger(cfg, run_dir, config))
    return Loggers(loggers)
