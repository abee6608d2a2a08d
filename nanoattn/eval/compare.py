"""Length evaluations side by side: read their reports, tabulate them.

Design choices:

- Input is what ``scripts/eval_length.py`` writes: a ``length_eval*.json`` file, or a run
  directory (then its ``length_eval.json``). A run's label is its directory name, plus the file's
  suffix for zero-shot scalings (``rope/yarn4``), so one figure can mix runs and scalings.
- The table has a row per run and a column per length; a cell is ``ppl (ratio×)`` with the ratio
  ppl(L) / ppl(training length), the number that says whether an encoding holds up independently
  of how good it is in distribution. Lengths a run did not reach read ``n/a`` (learned positions
  past their table), lengths it was not evaluated at stay empty. Reports that carry their run's
  training tokens/s (the extrapolation lab's) get a last column with it. A file is such a
  table (``is_length_table``, the one a command may replace) when it opens with its header.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nanoattn.eval.length import REPORT_STEM
from nanoattn.eval.runs import report_label
from nanoattn.eval.tables import format_table

REPORT_NAME = f"{REPORT_STEM}.json"
LENGTH_KEYS = frozenset({"length", "ppl"})  # what every entry of a length report's results has


def load_report(path: str | Path) -> tuple[str, dict[str, Any]]:
    """(label, report) from a length_eval JSON file or a run directory holding length_eval.json."""
    path = Path(path)
    file = path / REPORT_NAME if path.is_dir() else path
    if not file.is_file():
        raise ValueError(f"{str(path)!r} is neither a length_eval JSON file nor a run directory with "
                         f"{REPORT_NAME} (run scripts/eval_length.py first)")
    try:
        report = json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{file} is not JSON: {e}") from None
    results = report.get("results") if isinstance(report, dict) else None
    entries = results if isinstance(results, list) else []
    if not entries or not all(isinstance(r, dict) and LENGTH_KEYS <= r.keys() for r in entries):
        raise ValueError(f"{file} is not a length evaluation (its 'results' are not a non-empty list of "
                         f"{{{', '.join(sorted(LENGTH_KEYS))}, ...}}): compare_length reads the reports of "
                         "scripts/eval_length.py")
    return report_label(file, REPORT_STEM), report


# Optional columns of length_table: a report key, its header and its cells' format.
LAB_COLUMNS = (("kv_bytes_per_token", "KV bytes/token", "{:,.0f}"),
               ("max_attn_logit", "max attention logit", "{:.1f}"))


def length_table_caption(baseline: str | None = None) -> str:
    """What a length table's cells are (``length_table``), printed above it by the commands."""
    ratio = (f"to {baseline}'s perplexity at the same length" if baseline is not None
             else "to the same run's perplexity at its training length")
    return (f"Perplexity on held-out text by evaluation length (tokens, and × the training length); in "
            f"parentheses, its ratio {ratio}.\n")


def length_table(reports: Sequence[Mapping[str, Any]], labels: Sequence[str],
                 baseline: str | None = None) -> str:
    """Rows: runs; columns: lengths; cells: ``ppl (ratio×)``, the ratio to the run's own perplexity at its
    training length, or with ``baseline`` (one of ``labels``) to that run's at the same length."""
    lengths = sorted({r["length"] for report in reports for r in report["results"]})
    train_lengths = {report["train_seq_len"] for report in reports}
    shared = next(iter(train_lengths)) if len(train_lengths) == 1 else None
    header = ["run", *(f"{n} ({n / shared:g}×)" if shared else str(n) for n in lengths)]
    # The labs' reports carry their run's price: training speed, and the KV cache per token.
    extras = [column for column in LAB_COLUMNS if any(report.get(column[0]) for report in reports)]
    header += [title for _, title, _ in extras]
    reference = None if baseline is None else {r["length"]: r.get("ppl") for r in
                                                reports[list(labels).index(baseline)]["results"]}
    rows = []
    for report, label in zip(reports, labels, strict=True):
        by_length = {r["length"]: r for r in report["results"]}
        own = by_length.get(report["train_seq_len"], {}).get("ppl")
        cells = []
        for length in lengths:
            result = by_length.get(length)
            if result is None:
                cells.append("")
            elif result.get("ppl") is None:
                cells.append("n/a")
            else:
                base = own if reference is None else reference.get(length)
                ratio = f" ({result['ppl'] / base:.2f}×)" if base else ""
                cells.append(f"{result['ppl']:.1f}{ratio}")
        cells += [form.format(report[key]) if report.get(key) else "" for key, _, form in extras]
        rows.append([label, *cells])
    return format_table(header, rows)


def is_length_table(path: Path) -> bool:
    """True when ``path`` holds a table ``length_table`` wrote: a markdown table opening ``| run |``."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.readline().startswith("| run |")
    except (OSError, UnicodeDecodeError):
        return False
