"""The benchmark's entry point: run the sections, print each as a table, write them as a results page.

The page (``<out>/bench.{json,md}``, ``nanoattn.eval.results``) holds the rows of every section
with what made them (the command, commit, machine, date) and what else moves the numbers: the
config, torch's thread count and the load averages before and after each section (how shared the
machine was). It goes to ``runs/bench/`` unless ``out`` names a folder (``docs/results``
publishes it), and it is the only file the command writes there.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nanoattn.bench.core import BenchConfig, Row, run_sections
from nanoattn.eval.results import check_page_output, header_lines, provenance, write_page
from nanoattn.eval.tables import format_table as markdown_table

ABOUT = ("Training-step, decoding and evaluation speed of nanoattn against transformers' models of the same "
         "shape and weights and a bare PyTorch block, each measured side by side in one process (medians "
         "of alternated repetitions), and the price of every encoding and attention variant; the rules "
         "of each section are in docs/bench.md.")


def run_bench(cfg: BenchConfig) -> dict[str, list[Row]]:
    """Run ``cfg.only``; print a table per section as it ends; write the page. The rows."""
    check_page_output(Path(cfg.out or "runs/bench"), "bench", "bench.out")  # before benching, not after
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    loads = {"start": os.getloadavg()}  # 1, 5 and 15-minute load averages

    def report(name: str, rows: list[Row]) -> None:
        loads[name] = os.getloadavg()
        print(format_table(rows), f"load average {loads[name][0]:.2f}, {torch.get_num_threads()} threads",
              sep="\n", end="\n\n", flush=True)

    results = run_sections(cfg.only, cfg, on_done=report)
    settings = dict(dataclasses.asdict(cfg), threads=torch.get_num_threads(), load_average=loads)
    page = {**provenance("bench", "Benchmarks", ABOUT), "settings": settings, "sections": results}
    path = write_page(Path(cfg.out or "runs/bench"), page, render=render_bench, key="bench.out")
    print(f"wrote {path} and its JSON")
    return results


def render_bench(page: Mapping[str, Any]) -> str:
    """The bench page: its header, then a table per section."""
    lines = header_lines(page)
    for name, rows in page["sections"].items():
        columns = list(dict.fromkeys(key for row in rows for key in row))
        lines += ["", f"## {name}", "", markdown_table(columns, ([cell(row.get(c)) for c in columns]
                                                               for row in rows)).rstrip("\n")]
    return "\n".join(lines) + "\n"


def cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return "" if value is None else str(value)


def format_table(rows: list[Row]) -> str:
    """Rows as an aligned text table; columns are every key, in first-seen order."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
