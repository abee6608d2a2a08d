"""Fixtures of the training tests: one tiny byte-level corpus, prepared once per session, and
configs of a 2-layer d_model=32 model that trains in a fraction of a second per step.

Helpers are handed out as fixtures (tests/ has no packages).
"""

from __future__ import annotations

import copy
import os
import random
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from nanoattn.config import DataConfig
from nanoattn.data import ensure_prepared
from nanoattn.logging import read_metrics

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "train.py"

# Short, seeded "sentences" over a small alphabet: ~60 KB, enough distinct windows for tiny batches.
_SYLLABLES = ("ba", "ko", "ri", "tu", "ne", "sa", "lo", "mi", "da", "fe", "gu", "ha")


def _corpus_text(n_lines: int = 2500, seed: int = 7) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        words = ["".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3)))
                 for _ in range(rng.randint(2, 8))]
        lines.append(" ".join(words) + rng.choice(".!?"))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory) -> dict[str, Any]:
    """The `data` section of a tiny text corpus with the byte tokenizer, already prepared."""
    root = tmp_path_factory.mktemp("train_data")
    corpus = root / "corpus.txt"
    corpus.write_text(_corpus_text())
    data = {"name": "tiny", "corpus": "text", "paths": [str(corpus)], "root": str(root / "prepared"),
            "tokenizer": {"type": "byte", "vocab_size": 300}}
    ensure_prepared(DataConfig.from_dict(copy.deepcopy(data)))
    return data


TINY_MODEL = {"vocab_size": 64, "d_model": 32, "n_layer": 2, "n_head": 2, "n_kv_head": 1, "d_ff": 64,
              "max_seq_len": 32}
# Eager whatever an experiment sets (experiment=arithmetic compiles): a run of a few steps is shorter than
# its compilation.
TINY_TRAIN = {"batch_size": 4, "max_steps": 12, "warmup_steps": 2, "lr": 3e-3, "log_interval": 1,
              "eval_interval": 4, "eval_steps": 2, "ckpt_interval": 4, "keep_last": None, "dtype": "float32",
              "compile": False}


@pytest.fixture
def tiny_config(tiny_data) -> Callable[..., dict[str, Any]]:
    """tiny_config(out_dir, model={...}, **train_fields) -> a RunConfig dict for nanoattn.train.train."""

    def make(out_dir: Path, *, model: dict[str, Any] | None = None, logger: str = "none",
             **train: Any) -> dict[str, Any]:
        return {"out_dir": str(out_dir), "model": {**TINY_MODEL, **(model or {})},
                "data": copy.deepcopy(tiny_data), "train": {**TINY_TRAIN, **train},
                "logger": {"type": logger}}

    return make


def _hydra_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    return str(value)


def _overrides(cfg: dict[str, Any], prefix: str = "") -> list[str]:
    """A RunConfig dict as Hydra command-line overrides."""
    out = []
    for key, value in cfg.items():
        if isinstance(value, dict):
            out += _overrides(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={_hydra_value(value)}")
    return out


@pytest.fixture
def as_overrides() -> Callable[[dict[str, Any]], list[str]]:
    """as_overrides(cfg_dict) -> ["~recipe", "model.d_model=32", ...] for scripts/train.py: the dict's
    unset keys keep RunConfig's defaults, so the default recipe (configs/train.yaml) is dropped."""
    return lambda cfg: ["~recipe", *_overrides(cfg)]


@pytest.fixture
def run_script() -> Callable[..., subprocess.CompletedProcess]:
    """run_script(*args, cwd=..., env=..., timeout=...) runs scripts/train.py in a fresh Python."""

    def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd or REPO, capture_output=True,
                              text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})

    return run


# Every metrics.jsonl value that must be identical between two runs of the same trajectory
# (tok_per_s is a timing, so it is left out).
COMPARED = ("step", "train_loss", "lr", "tokens", "grad_norm", "val_loss", "val_bpb")


def _compare_runs(a: Path, b: Path, tol: float) -> None:
    ra_all = [{k: r[k] for k in COMPARED if k in r} for r in read_metrics(a / "metrics.jsonl")]
    rb_all = [{k: r[k] for k in COMPARED if k in r} for r in read_metrics(b / "metrics.jsonl")]
    assert [r["step"] for r in ra_all] == [r["step"] for r in rb_all]
    for ra, rb in zip(ra_all, rb_all, strict=True):
        assert ra.keys() == rb.keys(), ra["step"]
        for key in ra:
            assert ra[key] == pytest.approx(rb[key], abs=tol, rel=0), (ra["step"], key)


@pytest.fixture
def compare_runs() -> Callable[[Path, Path, float], None]:
    """compare_runs(run_a, run_b, tol): the same records, every compared value within tol."""
    return _compare_runs
