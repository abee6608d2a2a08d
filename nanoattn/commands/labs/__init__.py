"""The labs, one registry: each a ``Lab`` of the driver (``driver.py``) with its rows and claims.

- The perplexity labs live here: the extrapolation and passkey labs take every ``pos`` option
  (``nanoattn.config.options.encoding_options``), the attention lab every ``ATTENTION_VARIANTS``
  entry. The task-family labs (the task lab, its calibrations, the arithmetic lab) live in
  ``tasks.py``; ``LABS`` takes in both families, so it is the one registry a new lab joins. Rows
  are read from the registries when a lab runs, so a new encoding or variant is a row with no
  line here.
- A lab is a script (``scripts/<name>_lab.py``: its config class and entry function, exported
  here) and an entry of ``LABS``; its runs train with ``experiment=<name>``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nanoattn.commands.eval_length import LengthEvalConfig, run_length_eval
from nanoattn.commands.eval_passkey import PasskeyEvalConfig, run_passkey_eval
from nanoattn.commands.labs import papers
from nanoattn.commands.labs.arithmetic import (
    ARITHMETIC_LABS,
    ARITHMETIC_ROWS,
    CONTROL_BUDGETS,
    ArithmeticLabConfig,
)
from nanoattn.commands.labs.driver import Lab, LabRunsConfig, Quick, Report, Row, Trainer, run_lab
from nanoattn.commands.labs.runs import (
    is_finished,
    lab_jobs,
    largest_attention_logit,
    run_dir,
    train_runs,
)
from nanoattn.commands.labs.scales import WEB_CORPUS
from nanoattn.commands.labs.tasks import (
    BUDGET_FACTOR,
    DIGIT_FACTORS,
    LEARNED,
    TASK_LAB_ENCODINGS,
    TASK_LAB_TASKS,
    TASK_LABS,
    TaskLabConfig,
)
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.eval.passkey import DEFAULT_DEPTHS
from nanoattn.eval.plots import plot_length_curves, plot_passkey
from nanoattn.eval.runs import is_path, load_for_eval, scaling_tag
from nanoattn.eval.variant_heads import own_statistic
from nanoattn.model import KVCache
from nanoattn.validation import check_bool, check_positive_int, fail

# Zero-shot RoPE scalings of the extrapolation lab: factor 4 for each type, and 16 (the longest
# length) for PI and YaRN, each evaluated on the RoPE runs.
LAB_SCALINGS = tuple({"type": kind, "factor": factor} for kind, factor in
                     (("linear", 4), ("linear", 16), ("ntk", 4), ("dynamic", 4), ("yarn", 4), ("yarn", 16)))
LAB_MULTIPLES = (1, 2, 4, 8, 16)  # perplexity labs: lengths as multiples of the training length
# The attention lab's encodings beside its variants: PoPE (Gopalakrishnan et al. 2025) belongs to the same
# generation of papers, and its row is compared with the plain block's RoPE.
ATTENTION_LAB_ENCODINGS = ("pope",)
# The perplexity labs' quick form: a tenth of the steps, and fewer tokens scored at each length.
QUICK_STEPS, QUICK_TOKENS = ("train.max_steps=100",), {"max_tokens": 4096}
OWN_STATISTIC_BATCHES = 4  # attention lab: held-out batches the variant's own statistic is averaged over


@dataclass
class LabConfig(LabRunsConfig):
    """Every key of ``scripts/extrapolation_lab.py``."""

    owner: ClassVar[str] = "extrapolation_lab"
    passkey: bool = False  # the passkey lab (fine-tunes of the extrapolation runs), not perplexity
    samples: int = PasskeyEvalConfig.samples  # passkey lab: keys per length and depth
    # passkey lab: the extrapolation lab's runs it fine-tunes; None: that lab's at this scale,
    # runs/extrapolation (runs/extrapolation_gpu at scale=gpu)
    init_root: str | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        check_bool(self.owner, "passkey", self.passkey)
        check_positive_int(self.owner, "samples", self.samples)
        if self.init_root is not None and not is_path(self.init_root):
            fail(self.owner, "init_root", self.init_root, "must be a folder or null")

    def starting_root(self) -> Path:
        """Where the runs the passkey lab fine-tunes are: ``init_root``, or the extrapolation lab's at
        this scale."""
        scaled = "" if self.scale == "cpu" else f"_{self.scale}"
        return Path(self.init_root or f"runs/extrapolation{scaled}")


@dataclass
class AttentionLabConfig(LabRunsConfig):
    """Every key of ``scripts/attention_lab.py``."""

    owner: ClassVar[str] = "attention_lab"


def perplexity_report(cfg: LabRunsConfig, run: Path, row: Row) -> Report:
    report = run_length_eval(LengthEvalConfig(
        ckpt=str(run), max_tokens=cfg.max_tokens, mode="chunks", multiples=list(LAB_MULTIPLES),
        rope_scaling=None if row.scaling is None else dict(row.scaling), batch_size=cfg.batch_size,
        dtype=cfg.dtype, device=cfg.device))
    return report


def perplexity_cells(report: Report) -> dict[str, float | None]:
    """Perplexity at each multiple of the training length (chunks, the ALiBi paper's protocol)."""
    length = report["train_seq_len"]
    return {f"ppl {r['length'] / length:g}x": r.get("ppl") for r in report["results"]}


def extrapolation_rows(cfg: LabConfig) -> list[Row]:
    encodings = [Row(name, name, (f"pos={name}",)) for name in encoding_options()]
    return encodings + [Row(f"rope+{scaling_tag(s)}", "rope", (), s) for s in LAB_SCALINGS]


def passkey_report(cfg: LabConfig, run: Path, row: Row) -> Report:
    return run_passkey_eval(PasskeyEvalConfig(ckpt=str(run), samples=cfg.samples, batch_size=cfg.batch_size,
                                              dtype=cfg.dtype, device=cfg.device))


def passkey_cells(report: Report) -> dict[str, float | None]:
    """Exact-match retrieval at each length, averaged over the key's depths (None: cannot run there)."""
    cells: dict[str, float | None] = {}
    for length in dict.fromkeys(c["length"] for c in report["results"]):
        scored = [c.get("accuracy") for c in report["results"] if c["length"] == length]
        cells[f"acc {length}"] = None if None in scored else statistics.fmean(scored)
    return cells


def attention_report(cfg: AttentionLabConfig, run: Path, row: Row) -> Report:
    report = perplexity_report(cfg, run, row)
    ckpt, data = load_for_eval(run, device=cfg.device)
    batches = data.val_batches(OWN_STATISTIC_BATCHES, batch_size=cfg.batch_size, seq_len=ckpt.train_seq_len)
    own = own_statistic(ckpt.model, batches)  # its name is the lab's `about`, by variant
    return {**report, "kv_bytes_per_token": KVCache(ckpt.config, 1, 1, device="cpu").bytes_per_token(),
            "max_attn_logit": largest_attention_logit(run), "own_statistic": None if own is None else own[1]}


def attention_cells(report: Report) -> dict[str, float | None]:
    own = report["own_statistic"]
    return {**perplexity_cells(report), "KV bytes/token": report["kv_bytes_per_token"],
            "max logit": report["max_attn_logit"], **({"own stat": own} if own is not None else {})}


ABOUT_PERPLEXITY = (
    "Each row is a model of the extrapolation experiment (`configs/experiment/extrapolation.yaml`: 4 layers, "
    "d_model 128, trained at 128 tokens) with one encoding, evaluated on the held-out plays in "
    "non-overlapping chunks at 1-16x the training length (the protocol of Press et al. 2022); "
    "`rope+<scaling>` rows evaluate the RoPE runs under a zero-shot RoPE scaling. An encoding's price is "
    "the bench's (`docs/results/bench.md`, its `encodings` section: each timed alone, against RoPE), not "
    "a speed of these runs, which train two at a time.")

LABS: dict[str, Lab] = {lab.name: lab for lab in (
    Lab("extrapolation", "Length extrapolation: perplexity past the training length", ABOUT_PERPLEXITY,
        extrapolation_rows, perplexity_report, perplexity_cells, plot_length_curves,
        claims=papers.EXTRAPOLATION, quick=Quick(("rope", "alibi", "nope"), QUICK_STEPS, QUICK_TOKENS),
        gpu=WEB_CORPUS),
    Lab("passkey", "Passkey retrieval past the training length",
        "Each row fine-tunes the extrapolation lab's run of one encoding on passkey retrieval at its "
        "training length (`configs/experiment/passkey.yaml`), then asks for the key at 1-16x that length, "
        "at several depths; a cell is the exact-match rate averaged over the depths.",
        lambda cfg: [Row(name, name, (f"pos={name}",)) for name in encoding_options()],
        passkey_report, passkey_cells, plot_passkey,
        rates=lambda cfg, column: cfg.samples * len(DEFAULT_DEPTHS) if column.startswith("acc ") else None,
        train_extra=lambda cfg, row, seed: [
            f"train.init_from={run_dir(cfg.starting_root(), row.run, seed)}"], starts_from="extrapolation",
        quick=Quick(("rope", "alibi"), ("train.max_steps=200",),
                    {"init_root": "runs/extrapolation_quick", "samples": 5}), gpu=WEB_CORPUS),
    Lab("attention", "Attention variants: perplexity, price and logits",
        "Each row is the extrapolation experiment's model with RoPE and one attention variant "
        "(`nanoattn.config.options.ATTENTION_VARIANTS`, `configs/experiment/attention.yaml`), evaluated in "
        "chunks at 1-16x its training length; its price in time is the bench's (`docs/results/bench.md`, "
        "its `attention` section: each timed alone, against the plain block); `KV bytes/token` is what a "
        "decoded token adds to the cache, `max logit` the largest attention logit its evaluations saw "
        "during training; `own stat` the variant's own statistic on held-out windows at the training "
        "length (`nanoattn.eval.variant_heads.own_statistic`): the output gate's mean, XSA's share of the "
        "output removed, selective attention's pruned fraction, SSMax's s log n, the share of canon's "
        "taps on earlier tokens, FoX's forget span in tokens, stick-breaking's mass left unassigned, "
        "sigmoid's weight sum and the sinks' mass. The `pope` row is the plain block with PoPE for RoPE.",
        lambda cfg: [*(Row(name, name, (f"attention={name}",)) for name in ATTENTION_VARIANTS),
                     *(Row(name, name, (f"pos={name}",)) for name in ATTENTION_LAB_ENCODINGS)],
        attention_report, attention_cells, plot_length_curves, claims=papers.ATTENTION,
        quick=Quick(("plain", "qk_norm"), QUICK_STEPS, QUICK_TOKENS), gpu=WEB_CORPUS),
    *TASK_LABS,
    *ARITHMETIC_LABS,
)}


def extrapolation_lab(cfg: LabConfig, trainer: Trainer) -> dict[str, Any]:
    """The command: the perplexity lab, or with ``passkey`` the passkey lab."""
    return run_lab(LABS["passkey" if cfg.passkey else "extrapolation"], cfg, trainer)


def attention_lab(cfg: AttentionLabConfig, trainer: Trainer) -> dict[str, Any]:
    return run_lab(LABS["attention"], cfg, trainer)


def task_lab(cfg: TaskLabConfig, trainer: Trainer) -> dict[str, Any]:
    """The command: the task lab, or with ``calibrate`` one of its calibrations."""
    return run_lab(LABS[cfg.calibrate or "tasks"], cfg, trainer)


def arithmetic_lab(cfg: ArithmeticLabConfig, trainer: Trainer) -> dict[str, Any]:
    """The command: the arithmetic lab, or with ``calibrate`` its control's budgets."""
    return run_lab(LABS[cfg.calibrate or "arithmetic"], cfg, trainer)


__all__ = ["ARITHMETIC_ROWS", "BUDGET_FACTOR", "CONTROL_BUDGETS", "DIGIT_FACTORS", "LABS", "LEARNED",
           "TASK_LAB_ENCODINGS", "TASK_LAB_TASKS", "ArithmeticLabConfig", "AttentionLabConfig", "Lab",
           "LabConfig", "LabRunsConfig", "Row", "TaskLabConfig", "Trainer", "arithmetic_lab",
           "attention_lab", "extrapolation_lab", "is_finished", "lab_jobs", "run_lab", "task_lab",
           "train_runs"]
