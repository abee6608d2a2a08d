"""Passkey retrieval (Mohtashami & Jaggi 2023; the protocol of the PI and YaRN papers), sized for tiny models.

A five-digit key sits at a chosen depth of filler text from the corpus, and the model must
repeat it at the end::

    <filler> The pass key is 12345. Remember it. <filler> What is the pass key? The pass key is 12345

Design choices:

- Token-level construction. Each piece is encoded on its own and the ids are concatenated, so the
  key is the same token ids where it is stated and where it is asked for (a BPE merge with the
  following "." cannot change it), and a sample has exactly the requested number of tokens:
  ``length + 1`` ids, i.e. ``length`` model inputs, like a perplexity window. The papers' long
  instruction preamble is dropped: at 128 tokens it would leave no room for filler.
- Depth d in [0, 1] puts ``round(d * F)`` of the F filler tokens before the key sentence: 0 is
  the start of the context, 1 right before the question.
- Scoring is teacher-forced on the key's tokens: the summed log-probability of the key, and an
  exact match when the argmax at every key position is the key's token (greedy decoding would
  produce exactly the key). Each (length, depth) cell averages ``samples`` keys, each with its
  own filler offset, all drawn from a seeded RNG so runs and encodings see the same samples.
- Training: ``PasskeyMix`` wraps the data layer's ``TokenData`` and replaces a fixed fraction of
  each training batch's rows with passkey samples at the training length (filler from the train
  split, uniform depth, random key), a pure function of (seed, step, micro_step, rank) like the
  batches it wraps, so resumption stays exact. The trainer uses it when ``train.passkey_fraction``
  is above 0; validation batches stay plain text. A passkey row's targets are the key's tokens
  only (the rest are ``IGNORE_INDEX``), as supervised fine-tuning scores only the answer: with
  the whole sample's next-token loss the 6 key tokens among 128 drowned in filler, and the
  lab's RoPE model stayed exactly at chance (ln 10 nats per digit) after 1,000 steps of
  passkey-only batches; scoring the key alone, the recipe (configs/experiment/passkey.yaml)
  reaches exact match 1.00 at the training length in 1,200 steps.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nanoattn.data import TokenData
from nanoattn.eval.length import (
    DEFAULT_MULTIPLES,
    _autocast,
    check_lengths,
    default_output,
    lengths_from_multiples,
    load_for_eval,
    report_label,
)
from nanoattn.model import IGNORE_INDEX
from nanoattn.validation import check_positive_int

REPORT_STEM = "passkey"  # <run dir>/passkey[_<scaling>][_step<N>].json
KEY_DIGITS = 5
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
_PASSKEY_STREAM = 0x7061737B  # first word of every passkey seed, apart from the loader's streams


class PasskeyTemplate:
    """The token ids of the fixed pieces of a passkey sample, for one tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.stated = self._ids(" The pass key is")
        self.remember = self._ids(". Remember it.")
        self.question = self._ids(" What is the pass key? The pass key is")

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def key_ids(self, key: str) -> list[int]:
        return self._ids(" " + key)

    def overhead(self, key: str) -> int:
        """Tokens of a sample that are not filler."""
        return len(self.stated) + len(self.remember) + len(self.question) + 2 * len(self.key_ids(key))

    def sample(self, filler: np.ndarray, length: int, depth: float, key: str) -> tuple[torch.Tensor, int]:
        """(ids int64 [length + 1], number of key tokens at its end) with the key at ``depth``.

        ``filler`` holds at least ``length + 1 - overhead`` tokens; its first ones are used.
        """
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"passkey.depth={depth!r} is invalid: must be in [0, 1]")
        key_ids = self.key_ids(key)
        n_filler = length + 1 - self.overhead(key)
        if n_filler < 0:
            raise ValueError(f"passkey length {length} is too short: the passkey text alone takes "
                             f"{self.overhead(key)} tokens")
        filler = [int(t) for t in filler[:n_filler]]
        cut = round(depth * n_filler)
        ids = (filler[:cut] + self.stated + key_ids + self.remember + filler[cut:] + self.question + key_ids)
        return torch.tensor(ids, dtype=torch.long), len(key_ids)


def random_key(rng: np.random.Generator) -> str:
    """KEY_DIGITS digits, the first not 0 (so every key has the same number of digits)."""
    return str(int(rng.integers(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS)))


@torch.no_grad()
def score_passkey(model, samples: torch.Tensor, key_tokens: int,
                  dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """samples int64 [B, T + 1] ending with ``key_tokens`` key ids -> (key log-prob [B], exact match [B])."""
    device = next(model.parameters()).device
    samples = samples.to(device)
    with _autocast(device, dtype):
        logits = model(samples[:, :-1])[:, -key_tokens:].float()  # [B, K, V]: the predictions of the key
    targets = samples[:, -key_tokens:]  # [B, K]
    logprob = F.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0].sum(-1)  # [B]
    exact = (logits.argmax(-1) == targets).all(-1)  # [B]
    return logprob.cpu(), exact.cpu()


def evaluate_passkey(model, tokenizer, filler: np.ndarray, lengths: Sequence[int],
                     depths: Sequence[float] = DEFAULT_DEPTHS, *, samples: int = 20, seed: int = 0,
                     batch_size: int = 4, dtype: str = "float32") -> list[dict[str, Any]]:
    """One record per (length, depth): mean key log-prob, exact-match accuracy; or an ``error``."""
    check_positive_int("passkey", "samples", samples)
    check_positive_int("passkey", "batch_size", batch_size)
    lengths = check_lengths(lengths)
    template = PasskeyTemplate(tokenizer)
    cells = []
    for length in lengths:
        for depth in depths:
            cell: dict[str, Any] = {"length": length, "depth": float(depth)}
            rng = np.random.default_rng([_PASSKEY_STREAM, seed, length, round(float(depth) * 1000)])
            try:
                if filler.size < length + 1:
                    raise ValueError(f"the filler split has {filler.size} tokens, fewer than length {length}")
                examples = []
                for _ in range(samples):
                    start = int(rng.integers(0, filler.size - length))
                    examples.append(template.sample(filler[start:start + length + 1], length, depth,
                                                    random_key(rng)))
                scores = [score_passkey(model, torch.stack([ids for ids, _ in examples[i:i + batch_size]]),
                                        examples[i][1], dtype) for i in range(0, samples, batch_size)]
            except ValueError as e:  # learned positions past their table, a length too short
                cell.update(logprob=None, accuracy=None, error=str(e).splitlines()[0])
            else:
                cell["logprob"] = torch.cat([lp for lp, _ in scores]).mean().item()
                cell["accuracy"] = torch.cat([ex for _, ex in scores]).float().mean().item()
            cells.append(cell)
    return cells


def run_passkey_eval(
    ckpt: str | Path,
    *,
    lengths: Sequence[int] | None = None,
    multiples: Sequence[float] = DEFAULT_MULTIPLES,
    depths: Sequence[float] = DEFAULT_DEPTHS,
    samples: int = 20,
    seed: int = 0,
    batch_size: int = 4,
    dtype: str = "float32",
    device: str = "cpu",
    data_dir: str | Path | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    plot: bool = True,
) -> dict[str, Any]:
    """Passkey retrieval of a checkpoint at several lengths and depths; writes JSON and a heat map.

    Filler comes from the held-out split of ``data_dir`` (default: the run's data). ``out=None``
    writes ``<run dir>/passkey[_<scaling>][_step<N>].json``. Returns the report.
    """
    checkpoint, data = load_for_eval(ckpt, rope_scaling, device, data_dir)
    if lengths is None:
        lengths = lengths_from_multiples(checkpoint.train_seq_len, multiples)
    began = time.perf_counter()
    cells = evaluate_passkey(checkpoint.model, data.tokenizer, data.tokens("val"), lengths, depths,
                             samples=samples, seed=seed, batch_size=batch_size, dtype=dtype)
    report = {
        "checkpoint": str(checkpoint.path),
        "step": checkpoint.step,
        "pos": checkpoint.config.pos,
        "train_seq_len": checkpoint.train_seq_len,
        "samples": samples,
        "seed": seed,
        "rope_scaling": checkpoint.config.rope_scaling,
        "seconds": round(time.perf_counter() - began, 1),
        "results": cells,
    }
    out = Path(out) if out is not None else default_output(ckpt, rope_scaling, stem=REPORT_STEM)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if plot:
        plot_passkey([report], [report_label(out, REPORT_STEM)], out.with_suffix(".png"))
    return report


def passkey_table(report: Mapping[str, Any]) -> str:
    """Markdown: a row per depth, a column per length, exact-match accuracy (``n/a``: cannot run)."""
    lengths = sorted({c["length"] for c in report["results"]})
    depths = sorted({c["depth"] for c in report["results"]})
    cells = {(c["depth"], c["length"]): c.get("accuracy") for c in report["results"]}
    rows = ["| depth | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for depth in depths:
        values = [cells.get((depth, n)) for n in lengths]
        rows.append(f"| {depth:g} | " + " | ".join("n/a" if v is None else f"{v:.2f}" for v in values) + " |")
    return "\n".join(rows) + "\n"


def plot_passkey(reports: Sequence[Mapping[str, Any]], labels: Sequence[str], path: str | Path) -> Path:
    """One length x depth heat map of exact-match accuracy per report (grey: the model cannot run it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(reports), 3)
    rows = math.ceil(len(reports) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.6 * columns, 3.8 * rows), squeeze=False,
                             layout="constrained")  # titles and tick labels of neighbours never overlap
    for axis in axes.flat[len(reports):]:
        axis.set_visible(False)
    for axis, report, label in zip(axes.flat, reports, labels, strict=False):
        lengths = sorted({c["length"] for c in report["results"]})
        depths = sorted({c["depth"] for c in report["results"]})
        grid = np.full((len(depths), len(lengths)), np.nan)  # [depth, length]
        for cell in report["results"]:
            if cell.get("accuracy") is not None:
                grid[depths.index(cell["depth"]), lengths.index(cell["length"])] = cell["accuracy"]
        cmap = plt.get_cmap("viridis").with_extremes(bad="lightgray")
        image = axis.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto", origin="lower")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                axis.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                          color="white" if value < 0.5 else "black")
        axis.set_xticks(range(len(lengths)), [str(n) for n in lengths], rotation=45)
        axis.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        axis.set(xlabel="context length (tokens)", ylabel="key depth",
                 title=f"{label} (trained at {report['train_seq_len']})")
    fig.colorbar(image, ax=axes, shrink=0.6, label="exact-match accuracy")
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def passkey_lab(runs_root: str | Path = "runs/passkey", out_dir: str | Path = "docs", *,
                encodings: Sequence[str] = ("sinusoidal", "learned", "rope", "alibi", "nope"),
                multiples: Sequence[float] = DEFAULT_MULTIPLES, depths: Sequence[float] = DEFAULT_DEPTHS,
                samples: int = 20, batch_size: int = 4, dtype: str = "float32", device: str = "cpu",
                log=print) -> str:
    """Passkey retrieval of ``<runs_root>/<pos>`` for each encoding -> ``<out_dir>/passkey.png``.

    Returns a markdown table (rows: encodings, columns: lengths, cells: accuracy over all depths),
    also written between the ``passkey-table`` markers of ``<out_dir>/extrapolation.md``.
    """
    from nanoattn.eval.compare import write_table

    runs_root = Path(runs_root)
    missing = [pos for pos in encodings if not (runs_root / pos).is_dir()]
    if missing:
        raise ValueError(f"no run directory for {', '.join(missing)} under {runs_root}; train them with "
                         "python scripts/train.py -m experiment=passkey pos=" + ",".join(encodings))
    reports = []
    for pos in encodings:
        reports.append(run_passkey_eval(runs_root / pos, multiples=multiples, depths=depths, samples=samples,
                                        batch_size=batch_size, dtype=dtype, device=device))
        log(f"passkey {pos}: evaluated in {reports[-1]['seconds']:.1f} s")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_passkey(reports, list(encodings), out_dir / "passkey.png")
    lengths = sorted({c["length"] for c in reports[0]["results"]})
    rows = ["| run | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for pos, report in zip(encodings, reports, strict=True):
        cells = []
        for length in lengths:
            scored = [c["accuracy"] for c in report["results"] if c["length"] == length]
            cells.append("n/a" if None in scored else f"{sum(scored) / len(scored):.2f}")
        rows.append(f"| {pos} | " + " | ".join(cells) + " |")
    table = "\n".join(rows) + "\n"
    write_table(out_dir / "extrapolation.md", table, name="passkey-table")
    return table


class PasskeyMix:
    """``TokenData`` whose training batches carry passkey samples in a fixed share of their rows."""

    def __init__(self, data: TokenData, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"train.passkey_fraction={fraction!r} is invalid: must be in (0, 1]")
        self.data, self.fraction = data, fraction
        self.template = PasskeyTemplate(data.tokenizer)

    def __getattr__(self, name: str) -> Any:  # tokenizer, vocab_size, val_batches, ...: the wrapped data's
        return getattr(self.data, name)

    def train_batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, micro_step: int = 0,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The wrapped batch (x, y) [B, T], its first round(fraction * B) rows replaced by passkey samples.

        A passkey row's targets are ``IGNORE_INDEX`` except the key's tokens at its end.
        """
        x, y = self.data.train_batch(step, batch_size=batch_size, seq_len=seq_len, seed=seed,
                                     micro_step=micro_step, rank=rank, world_size=world_size)
        n = round(self.fraction * batch_size)
        if n == 0:
            return x, y
        rng = np.random.default_rng([_PASSKEY_STREAM, seed, step, micro_step, rank])
        tokens = self.data.tokens("train")
        x, y = x.clone(), y.clone()
        for row in range(n):
            start = int(rng.integers(0, tokens.size - seq_len))
            ids, key_tokens = self.template.sample(tokens[start:start + seq_len + 1], seq_len,
                                                   float(rng.random()), random_key(rng))
            x[row], y[row] = ids[:-1], ids[1:]
            y[row, :-key_tokens] = IGNORE_INDEX
        return x, y
