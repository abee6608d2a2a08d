"""The run directory: where a run lives, whether a resumption is the same run, its tokenizer.

``run_directory_for`` names the directory a run will lock and write (``check_output``: never
empty, a repository's root or inside a checkpoint); under that lock, ``locate_run`` decides
which checkpoint it resumes, and ``check_same_run`` refuses to continue a run under a different
config (only the keys in ``RESUME_MAY_CHANGE`` may differ). A new run starts only where none of
its files (``RUN_FILES``) are, so it overwrites nothing it did not write; a start that fails
before the run trained takes its files back (``undo_failed_start``), so the same out_dir can be
retried.

The tokenizer is part of the run: ``snapshot_tokenizer`` writes the one the run started with
into ``<run>/tokenizer.json`` (and the data's fingerprint into ``<run>/data.json``), every
checkpoint copies that snapshot, and a resumption whose data folder now holds another tokenizer
is refused (``check_run_tokenizer``), so token ids never change meaning mid-run.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from nanoattn.checkpoint import (
    CHECKPOINTS,
    LATEST,
    init_model_config,
    list_checkpoints,
    resolve_checkpoint,
    run_directory,
)
from nanoattn.config import ModelConfig, RunConfig
from nanoattn.data import TokenData, load_tokenizer
from nanoattn.runtime import RUN_CONFIG, check_output, write_atomic
from nanoattn.validation import declared_defaults

# Keys that may differ between a run and its resumption: where and how long it runs (its last step,
# the accuracy it stops at), how it is watched, and how fast it computes. Everything else (model,
# data, optimisation, seed) must match.
# train.batch_size may change only with the world size, keeping batch_size * world_size.
RESUME_MAY_CHANGE = ("out_dir", "train.max_steps", "train.stop_at_accuracy", "train.resume",
                     "train.eval_interval", "train.eval_steps", "train.log_interval", "train.ckpt_interval",
                     "train.keep_last", "train.compile", "train.device", "train.dtype", "train.batch_size",
                     "data.root", "model.attn_kernel", "logger.")
RUN_TOKENIZER = "tokenizer.json"  # <run>/tokenizer.json: the tokenizer the run started with
RUN_DATA = "data.json"  # <run>/data.json: the prepared data it started from (folder, fingerprint)
RUN_METRICS = "metrics.jsonl"
RUN_FILES = (RUN_CONFIG, RUN_TOKENIZER, RUN_DATA, RUN_METRICS, CHECKPOINTS)  # what a run writes in out_dir


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value and key != "rope_scaling":
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _same(a: Any, b: Any) -> bool:
    """Equal, or floats equal up to rounding (a derived value may be printed with fewer digits)."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))
    return a == b or (numbers and math.isclose(a, b, rel_tol=1e-9))


def differing_keys(saved: Mapping[str, Any], current: Mapping[str, Any],
                   may_differ: Sequence[str]) -> list[str]:
    """The keys (``section.key``, sorted) where the run config ``current`` differs from ``saved``, but
    for ``may_differ`` (a key, or a prefix ending in "."), each shown as ``key=<saved> there, <current>
    now``.

    A key ``saved`` lacks is a field added after that run started; a new field's declared default
    is the behaviour from before it existed, so the run had that value.
    """
    old, new = {**_flatten(declared_defaults(RunConfig)), **_flatten(dict(saved))}, _flatten(dict(current))
    return [f"{k}={old.get(k)!r} there, {new.get(k)!r} now" for k in sorted(set(old) | set(new))
            if not any(k == m or (m.endswith(".") and k.startswith(m)) for m in may_differ)
            and not _same(old.get(k), new.get(k))]


class Trainer(NamedTuple):
    """How a lab (or any driver of runs) trains: the training command it starts once per run
    (``python scripts/train.py``), and what that command resolves to for a list of overrides: the run
    config (a dict) its run's config.yaml holds, out_dir aside. ``differing_keys`` of the two tells
    whether a run directory holds the run that command trains."""

    command: Sequence[str]
    resolve: Callable[[Sequence[str]], dict[str, Any]]


def check_same_run(saved: dict[str, Any], current: dict[str, Any], where: Path) -> None:
    """Raise a one-line ValueError naming the keys where ``current`` differs from the run in ``where``
    (``differing_keys``: only ``RESUME_MAY_CHANGE`` may)."""
    differ = differing_keys(saved, current, RESUME_MAY_CHANGE)
    if differ:
        more = f"; +{len(differ) - 4} more" if len(differ) > 4 else ""
        allowed = ", ".join(k + "*" if k.endswith(".") else k for k in RESUME_MAY_CHANGE)
        raise ValueError(f"out_dir {str(where)!r} holds a different run: {'; '.join(differ[:4])}{more} "
                         f"(only these may change on resume: {allowed})")


def reached_accuracy(meta: Mapping[str, Any], stop_at_accuracy: float | None) -> bool:
    """Whether a checkpoint (its config.json) ended its run at its accuracy: the exact match at 1x
    measured on its weights reached ``train.stop_at_accuracy``. A run cut short has none, or less."""
    exact = meta.get("exact_1x")
    return stop_at_accuracy is not None and exact is not None and exact >= stop_at_accuracy


def run_directory_for(out_dir: str | Path, resume: bool | str) -> Path:
    """The directory a run writes: ``out_dir``, or the run of the checkpoint ``train.resume`` names."""
    if isinstance(resume, bool):
        return check_output(out_dir, "out_dir", what="a run", folder=True)
    return check_output(run_directory(resolve_checkpoint(resume)), "train.resume", what="a run", folder=True)


def locate_run(out_dir: str | Path, resume: bool | str) -> tuple[Path, Path | None]:
    """(run directory, checkpoint to resume or None); raises before anything is written."""
    out_dir = Path(out_dir)
    if resume is False:
        if (out_dir / "config.yaml").exists():
            raise ValueError(f"out_dir {str(out_dir)!r} already holds a run: continue it with "
                             "train.resume=true, or choose another out_dir")
        found = [name for name in RUN_FILES if (out_dir / name).exists()]
        if found:
            raise ValueError(f"out_dir {str(out_dir)!r} holds {found[0]} but no run (no config.yaml): "
                             "a run never overwrites files it did not write; choose another out_dir")
        return out_dir, None
    if resume is True:
        if not (out_dir / "config.yaml").exists():
            raise ValueError(f"train.resume=true but out_dir {str(out_dir)!r} holds no run "
                             "(no config.yaml); set out_dir to the run directory to continue")
        ckpt_root = out_dir / CHECKPOINTS
        if not (ckpt_root / "latest").exists() and not list_checkpoints(ckpt_root):
            return out_dir, None  # killed before its first checkpoint: start again from step 0
        return out_dir, resolve_checkpoint(out_dir)
    ckpt = resolve_checkpoint(resume)
    run_dir = run_directory(ckpt)
    if ckpt.parent.name != CHECKPOINTS or not (run_dir / "config.yaml").exists():
        raise ValueError(f"train.resume={resume!r}: {ckpt} is not inside a run directory "
                         f"(no {run_dir / 'config.yaml'}); train.init_from starts a new run from it")
    latest = resolve_checkpoint(run_dir)
    if latest.resolve() != ckpt.resolve():
        raise ValueError(f"train.resume={resume!r} is older than its run's latest checkpoint "
                         f"{latest.name}: continuing it would mix two trajectories; delete the newer "
                         "checkpoints first, or use train.init_from with a new out_dir")
    return run_dir, ckpt


def resolve_init_from(cfg: RunConfig | Mapping[str, Any]) -> RunConfig:
    """A copy of ``cfg`` (ours to adjust) whose model, with ``train.init_from``, is the checkpoint's."""
    if isinstance(cfg, RunConfig):
        values = copy.deepcopy(cfg.to_dict())
    else:
        values = copy.deepcopy(dict(cfg))
    init_from = (values.get("train") or {}).get("init_from")
    if init_from:
        model = values.get("model") or {}
        model = model.to_dict() if isinstance(model, ModelConfig) else dict(model)
        values["model"] = init_model_config(init_from, model).to_dict()
    return RunConfig.from_dict(values)


def check_run_tokenizer(run_dir: Path, data: TokenData, resumed: Path | None) -> None:
    """Resuming: refuse ``data`` whose tokenizer is not the run's (its snapshot, else ``resumed``'s)."""
    snapshot = run_dir / RUN_TOKENIZER
    # A run from before snapshots existed: its checkpoint's tokenizer is the reference.
    reference = snapshot if snapshot.exists() else None if resumed is None else resumed / RUN_TOKENIZER
    if reference is not None and reference.exists():
        data.check_tokenizer(load_tokenizer(reference), reference)


def snapshot_tokenizer(run_dir: Path, data: TokenData) -> None:
    """Starting: write the run's tokenizer (and its data's fingerprint) unless it has one already."""
    if not (run_dir / RUN_TOKENIZER).exists():
        write_atomic(run_dir / RUN_TOKENIZER, data.tokenizer.to_str())
        write_atomic(run_dir / RUN_DATA, json.dumps({"data_dir": str(data.data_dir),
                                                     "fingerprint": data.meta.get("fingerprint")}) + "\n")


def undo_failed_start(run_dir: Path) -> bool:
    """After a failure, take back the files of a run that never trained (no checkpoint, no metrics
    record), so that the same out_dir takes a new start; True if it did. A run that trained keeps
    everything: its records say how far it went."""
    metrics = run_dir / RUN_METRICS
    if (run_dir / CHECKPOINTS / LATEST).exists() or list_checkpoints(run_dir / CHECKPOINTS) or (
            metrics.exists() and metrics.stat().st_size > 0):
        return False
    for name in (RUN_CONFIG, RUN_TOKENIZER, RUN_DATA, RUN_METRICS):
        (run_dir / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (run_dir / CHECKPOINTS).rmdir()  # empty: a save that failed removed its partial copy
    return True
