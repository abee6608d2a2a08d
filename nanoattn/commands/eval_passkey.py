"""``scripts/eval_passkey.py``: passkey retrieval of a checkpoint at several lengths and depths.

``run_passkey_eval`` loads the run, takes filler from its held-out split and writes the report
(``<run dir>/passkey[_<scaling>][_seed<k>][_step<N>].json``) and its heat map; ``eval_passkey`` is the
command: the same, then accuracy per depth and length on stdout. The measurement is
``nanoattn.eval.passkey`` (docs/extrapolation.md, "Passkey retrieval").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanoattn.eval.passkey import DEFAULT_DEPTHS, REPORT_STEM, evaluate_passkey, passkey_table
from nanoattn.eval.plots import plot_passkey
from nanoattn.eval.runs import AtLengthsConfig, checkpoint_fields
from nanoattn.validation import as_float, check_positive_int, check_seed, fail


@dataclass
class PasskeyEvalConfig(AtLengthsConfig):
    """Every key of ``scripts/eval_passkey.py`` (the inherited ones: ``AtLengthsConfig``)."""

    owner = "eval_passkey"
    report_stem = REPORT_STEM
    file_keys = {"seed": "seed"}  # another seed's report goes beside: <stem>_seed<k>.json

    depths: Sequence[float] = DEFAULT_DEPTHS  # where the key sits: 0 = start of the context, 1 = the end
    samples: int = 20  # keys (each with its own filler) per length and depth
    seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if isinstance(self.depths, (str, bytes)) or not isinstance(self.depths, Sequence) or not self.depths:
            fail(self.owner, "depths", self.depths, "must be a non-empty list of depths in [0, 1]")
        for depth in self.depths:
            if not 0.0 <= as_float(depth) <= 1.0:
                fail(self.owner, "depths", list(self.depths), f"{depth!r} is not in [0, 1]")
        self.depths = tuple(self.depths)  # the declared default's type, whatever the caller passed
        check_positive_int(self.owner, "samples", self.samples)
        check_seed(self.owner, "seed", self.seed)


def run_passkey_eval(cfg: PasskeyEvalConfig) -> dict[str, Any]:
    """Passkey retrieval of ``cfg.ckpt``; write the JSON report (and its heat map). Returns the report."""
    checkpoint, data = cfg.load()
    began = time.perf_counter()
    cells = evaluate_passkey(checkpoint.model, data.tokenizer, data.tokens("val"),
                             cfg.lengths_for(checkpoint), cfg.depths, samples=cfg.samples,
                             seed=cfg.seed, batch_size=cfg.batch_size, dtype=cfg.dtype)
    report = {
        **checkpoint_fields(checkpoint),
        "samples": cfg.samples,
        "seed": cfg.seed,
        "rope_scaling": checkpoint.config.rope_scaling,
        "seconds": round(time.perf_counter() - began, 1),
        "results": cells,
    }
    cfg.save(report, plot_passkey)
    return report


def eval_passkey(cfg: PasskeyEvalConfig) -> dict[str, Any]:
    """The command: ``run_passkey_eval``, then the accuracy table and the files written."""
    report = run_passkey_eval(cfg)
    print(passkey_table(report), end="")
    print(cfg.written())
    return report
