"""A model's accuracy on a task of the suite, by instance size: the length-generalization measurement.

Design choices:

- Teacher-forced scoring: at every answer position the model's argmax is compared with the
  answer's token. An instance is an exact match when all its answer tokens (the closing EOT
  included) are right, which is exactly when greedy decoding would write the answer and stop;
  for flip-flop, whose reads sit inside the sequence, every read must be right given the true
  sequence before it. Per-token accuracy is the share of answer tokens right, pooled over a
  bin's instances.
- Bins are factors of the training length L: factor f covers sizes (f' L, f L] with f' the
  previous factor (the 1x bin: (L/2, L], never below the task's smallest size). ``per_bin``
  instances each (1,000 by default: a 95% interval of at most +-3.1 points, the Wilson
  interval is reported), sizes uniform in the bin, filler from the held-out split.
- Every instance has its own seed words ``[EVAL_STREAM, seed, bin, i]``, kept in the report with
  its size and result, so any number can be re-derived (``TaskData.draw``). The trainer's checks
  (``exact_1x``) use ``CHECK_STREAM`` in place of ``EVAL_STREAM``.
- A bin the model cannot run (learned positions past their table raise ValueError) is reported
  with null accuracies and the error, like a length of the perplexity evaluation.
- Memory is linear in the length: batches of ``batch_size`` instances, each batch as wide as its
  longest row, and only the argmax is kept.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from nanoattn.config import ModelConfig
from nanoattn.data import TaskData
from nanoattn.data.tasks import EVAL_STREAM, row_inputs
from nanoattn.eval.tables import format_table
from nanoattn.model import IGNORE_INDEX, check_forward_fits
from nanoattn.runtime import autocast, autocast_dtype, check_fits
from nanoattn.tasks import EVAL_FACTORS, Task
from nanoattn.validation import as_float, fail

DEFAULT_FACTORS = EVAL_FACTORS
DEFAULT_PER_BIN = 1000
# An instance's record as Python objects (its seed words, size and result), measured with tracemalloc:
# the report keeps every one, and writing it takes more.
RECORD_BYTES = 320
TOKEN_BYTES = 8  # int64 ids: a batch's inputs and targets


def check_factors(owner: str, factors: Any) -> tuple[float, ...]:
    """``factors`` as a tuple of floats; a one-line error unless increasing positive finite numbers."""
    if isinstance(factors, (str, bytes)) or not isinstance(factors, Sequence) or not factors:
        fail(owner, "factors", factors, "must be a non-empty list of increasing positive numbers")
    values = tuple(as_float(f) for f in factors)
    increasing = all(b > a for a, b in itertools.pairwise(values))
    if not (values[0] > 0 and math.isfinite(values[-1]) and increasing):
        fail(owner, "factors", list(factors), "must be increasing positive finite numbers")
    return values


def size_bins(train_length: int, factors: Sequence[float], min_size: int = 1) -> list[tuple[int, int]]:
    """(smallest, largest) size of each bin: factor f covers (f' L, f L], f' the previous factor (1x: L/2)."""
    factors = check_factors("size_bins", factors)
    bins, previous = [], factors[0] / 2
    for factor in factors:
        low = max(min_size, math.floor(previous * train_length) + 1)
        high = math.floor(factor * train_length)
        if high < low:
            raise ValueError(f"factor {factor:g} of train_length={train_length} holds no size of its own "
                             f"(sizes {low}..{high}); space the factors further apart")
        bins.append((low, high))
        previous = factor
    return bins


def check_bins_fit(owner: str, task: Task, train_length: int, factors: Sequence[float], per_bin: int,
                   batch_size: int, model: ModelConfig | None = None, device: torch.device | None = None,
                   ) -> None:
    """Refuse, before the first instance is drawn, an evaluation that cannot fit memory: the records of
    ``per_bin`` instances in every bin (kept for the report), the widest batch of rows (the last bin's
    largest instance) and, given the ``model``, a forward pass over that batch on ``device``. The
    error names ``per_bin`` or ``factors``."""
    bins = size_bins(train_length, factors, task.min_size)
    cpu = torch.device("cpu")
    check_fits(RECORD_BYTES * per_bin * len(bins), cpu,
               f"keeping {len(bins)} bins x {per_bin:,} instance records", key=(owner, "per_bin", per_bin),
               at_least=True)
    rows, width = min(batch_size, per_bin), row_inputs(task, bins[-1][1])
    key = (owner, "factors", list(factors))
    check_fits(2 * TOKEN_BYTES * rows * width, cpu, f"a batch of {rows} {task.name} rows of {width:,} tokens "
               f"(sizes up to {bins[-1][1]:,})", key=key, at_least=True)
    if model is not None:
        check_forward_fits(model, rows, width, device or cpu, key)


def score_predictions(predicted: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                              torch.Tensor]:
    """(exact [B] bool, correct [B] int, scored [B] int) from argmax ids and targets, both [B, T].

    Positions whose target is ``IGNORE_INDEX`` are not answer tokens; a row without any is an error.
    """
    answer = targets != IGNORE_INDEX
    scored = answer.sum(dim=1)
    if bool((scored == 0).any()):
        raise ValueError("a row has no answer tokens (every target is IGNORE_INDEX): nothing to score")
    correct = ((predicted == targets) & answer).sum(dim=1)
    return correct == scored, correct, scored


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a proportion (95% with z=1.96)."""
    if n <= 0:
        raise ValueError(f"n={n} is invalid: an interval needs at least one trial")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@torch.no_grad()
def evaluate_task(model, data: TaskData, *, factors: Sequence[float] = DEFAULT_FACTORS,
                  per_bin: int = DEFAULT_PER_BIN, seed: int = 0, batch_size: int = 64,
                  dtype: str = "float32", stream: int = EVAL_STREAM) -> list[dict[str, Any]]:
    """One entry per bin: its sizes, exact-match and per-token accuracy, and every instance's record."""
    device = next(model.parameters()).device
    check_bins_fit("eval_task", data.task, data.train_length, factors, per_bin, batch_size, model.cfg, device)
    amp_dtype, _ = autocast_dtype(dtype, device)
    was_training = model.training
    model.eval()
    bins = []
    try:
        for index, (factor, sizes) in enumerate(zip(factors, size_bins(data.train_length, factors,
                                                                       data.task.min_size), strict=True)):
            seeds = [[stream, seed, index, i] for i in range(per_bin)]
            entry: dict[str, Any] = {"factor": factor, "sizes": list(sizes), "instances": per_bin}
            try:
                records = _score_bin(model, data, seeds, sizes, batch_size, device, amp_dtype)
            except ValueError as e:
                entry.update(exact=None, token_accuracy=None, error=str(e).splitlines()[0])
            else:
                exact = sum(r["exact"] for r in records)
                tokens = sum(r["scored"] for r in records)
                entry.update(exact=exact / per_bin, exact_ci95=list(wilson_interval(exact, per_bin)),
                             token_accuracy=sum(r["correct"] for r in records) / tokens, records=records)
            bins.append(entry)
    finally:
        model.train(was_training)
    return bins


def _score_bin(model, data: TaskData, seeds: list[list[int]], sizes: tuple[int, int], batch_size: int,
               device: torch.device, amp_dtype: torch.dtype | None) -> list[dict[str, Any]]:
    records = []
    for start in range(0, len(seeds), batch_size):
        chunk = seeds[start:start + batch_size]
        instances = [data.draw(words, sizes, "val") for words in chunk]
        x, y, *positions = data.rows(instances)  # positions: when the task gives them
        with autocast(device, amp_dtype):
            predicted = model(x.to(device), *(p.to(device) for p in positions)).argmax(dim=-1).cpu()
        exact, correct, scored = score_predictions(predicted, y)
        records += [{"seed": words, "size": item.size, "exact": bool(e), "correct": int(c), "scored": int(s)}
                    for words, item, e, c, s in zip(chunk, instances, exact, correct, scored, strict=True)]
    return records


def task_table(reports: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: a row per report (task, label), exact match (per-token accuracy) at each factor."""
    factors = sorted({b["factor"] for report in reports for b in report["results"]})
    rows = []
    for report, label in zip(reports, labels, strict=True):
        cells = {b["factor"]: b for b in report["results"]}
        rows.append([report["task"]["name"], label, *(_cell(cells.get(f)) for f in factors)])
    return format_table(["task", "run", *(f"{f:g}x" for f in factors)], rows)


def _cell(entry: Mapping[str, Any] | None) -> str:
    if entry is None or entry.get("exact") is None:
        return "n/a"
    return f"{entry['exact']:.2f} ({entry['token_accuracy']:.2f})"
