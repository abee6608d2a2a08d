"""Compare length evaluations across runs, and the extrapolation lab that produces them.

Design choices:

- Input is what ``length.run_length_eval`` writes: a ``length_eval*.json`` file, or a run
  directory (then its ``length_eval.json``). A run's label is its directory name, plus the file's
  suffix for zero-shot scalings (``rope/yarn4``), so one figure can mix runs and scalings.
- The table has a row per run and a column per length; a cell is ``ppl (ratio×)`` with the ratio
  ppl(L) / ppl(training length), the number that says whether an encoding holds up independently
  of how good it is in distribution. Lengths a run did not reach read ``n/a`` (learned positions
  past their table), lengths it was not evaluated at stay empty.
- The lab (``extrapolation_lab``) evaluates ``<runs_root>/<pos>`` for each encoding with
  non-overlapping chunks (the protocol of Press et al. 2022, whose result it reproduces), then
  the RoPE run again under each zero-shot scaling, and writes the figure and the table into
  ``out_dir``. In an existing markdown file the table replaces only the text between its
  ``<!-- extrapolation-table:begin/end -->`` markers, so the prose around it survives a rerun.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nanoattn.eval.length import (
    DEFAULT_MULTIPLES,
    REPORT_STEM,
    plot_length_curves,
    report_label,
    run_length_eval,
    scaling_tag,
)

REPORT_NAME = f"{REPORT_STEM}.json"
LAB_ENCODINGS = ("sinusoidal", "learned", "rope", "alibi", "nope")
# Zero-shot RoPE scalings of the lab: factor 4 for each type, and 16 (the longest length) for PI and YaRN.
LAB_SCALINGS = tuple({"type": kind, "factor": factor} for kind, factor in
                     (("linear", 4), ("linear", 16), ("ntk", 4), ("dynamic", 4), ("yarn", 4), ("yarn", 16)))


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
    if not isinstance(report, dict) or not isinstance(report.get("results"), list):
        raise ValueError(f"{file} is not a length evaluation (no 'results' list)")
    return report_label(file), report


def markdown_table(reports: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    """Rows: runs; columns: lengths; cells: ``ppl (ppl / ppl at the training length ×)``."""
    lengths = sorted({r["length"] for report in reports for r in report["results"]})
    train_lengths = {report["train_seq_len"] for report in reports}
    shared = next(iter(train_lengths)) if len(train_lengths) == 1 else None

    def heading(length: int) -> str:
        return f"{length} ({length / shared:g}×)" if shared else str(length)

    rows = ["| run | " + " | ".join(heading(n) for n in lengths) + " |",
            "|---|" + "---:|" * len(lengths)]
    for report, label in zip(reports, labels, strict=True):
        by_length = {r["length"]: r for r in report["results"]}
        base = by_length.get(report["train_seq_len"], {}).get("ppl")
        cells = []
        for length in lengths:
            result = by_length.get(length)
            if result is None:
                cells.append("")
            elif result.get("ppl") is None:
                cells.append("n/a")
            else:
                ratio = f" ({result['ppl'] / base:.2f}×)" if base else ""
                cells.append(f"{result['ppl']:.1f}{ratio}")
        rows.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def compare_length(paths: Sequence[str | Path], *, labels: Sequence[str] | None = None,
                   out: str | Path = "length_compare.png", table_out: str | Path | None = None) -> str:
    """Plot every run's curves into ``out`` and return the markdown table (also written to ``table_out``)."""
    if not paths:
        raise ValueError("compare_length needs at least one length_eval JSON file or run directory")
    loaded = [load_report(p) for p in paths]
    if labels is not None and len(labels) != len(loaded):
        raise ValueError(f"labels={list(labels)} has {len(labels)} entries for {len(loaded)} runs")
    labels = list(labels) if labels is not None else [label for label, _ in loaded]
    reports = [report for _, report in loaded]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_length_curves(reports, labels, out)
    table = markdown_table(reports, labels)
    if table_out is not None:
        Path(table_out).write_text(table)
    return table


def write_table(path: str | Path, table: str, name: str = "extrapolation-table") -> Path:
    """Put ``table`` between the ``<!-- name:begin/end -->`` markers of a markdown file (else append it)."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{table}{end}"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def extrapolation_lab(runs_root: str | Path = "runs/extrapolation", out_dir: str | Path = "docs", *,
                      encodings: Sequence[str] = LAB_ENCODINGS,
                      scalings: Sequence[Mapping[str, Any]] = LAB_SCALINGS,
                      multiples: Sequence[float] = DEFAULT_MULTIPLES, max_tokens: int = 32768,
                      batch_size: int = 4, dtype: str = "float32", device: str = "cpu",
                      log=print) -> str:
    """Evaluate ``<runs_root>/<pos>`` for each encoding (and RoPE under each scaling); write the comparison.

    Writes ``<out_dir>/extrapolation.png`` and the table into ``<out_dir>/extrapolation.md``;
    returns the table. Each evaluation's JSON and plot also land in its run directory.
    """
    runs_root = Path(runs_root)
    missing = [pos for pos in encodings if not (runs_root / pos).is_dir()]
    if missing:
        raise ValueError(f"no run directory for {', '.join(missing)} under {runs_root}; train them with "
                         "python scripts/train.py -m +experiment=extrapolation pos=" + ",".join(encodings))
    jobs = [(pos, pos, None) for pos in encodings]
    if "rope" in encodings:
        jobs += [(f"rope+{scaling_tag(s)}", "rope", dict(s)) for s in scalings]
    labels, reports = [], []
    for label, pos, scaling in jobs:
        began = time.perf_counter()
        reports.append(run_length_eval(runs_root / pos, multiples=multiples, mode="chunks",
                                       max_tokens=max_tokens, batch_size=batch_size, dtype=dtype,
                                       device=device, rope_scaling=scaling))
        labels.append(label)
        log(f"{label}: evaluated in {time.perf_counter() - began:.1f} s")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plot_length_curves(reports, labels, out_dir / "extrapolation.png")
    table = markdown_table(reports, labels)
    write_table(out_dir / "extrapolation.md", table)
    return table
