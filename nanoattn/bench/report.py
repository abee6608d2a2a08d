"""The benchmark's entry point: run the sections, print each as a table, write them all as JSON.

The settings written with the rows are the config and what else moves the numbers: torch's
thread count, the load averages before and after each section (how shared the machine was),
the torch and Python versions and the CPU's name.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
from typing import Any

import torch

from nanoattn.bench.core import BenchConfig, Row, run_sections
from nanoattn.runtime import write_atomic


def run_bench(cfg: BenchConfig) -> dict[str, list[Row]]:
    """Run ``cfg.only``; print a table per section as it ends; write ``cfg.out`` when set. The rows."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    loads = {"start": os.getloadavg()}  # 1, 5 and 15-minute load averages

    def report(name: str, rows: list[Row]) -> None:
        loads[name] = os.getloadavg()
        print(format_table(rows), f"load average {loads[name][0]:.2f}, {torch.get_num_threads()} threads",
              sep="\n", end="\n\n", flush=True)

    results = run_sections(cfg.only, cfg, on_done=report)
    if cfg.out is not None:
        settings = dict(dataclasses.asdict(cfg), threads=torch.get_num_threads(), load_average=loads,
                        torch=torch.__version__, python=platform.python_version(), cpu=machine_name())
        write_atomic(cfg.out, json.dumps({"settings": settings, "sections": results}, indent=2) + "\n")
        print(f"wrote {cfg.out}")
    return results


def machine_name() -> str:
    """The CPU's model name (Linux), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.partition(":")[2].strip() for line in f if line.startswith("model name")),
                        platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def format_table(rows: list[Row]) -> str:
    """Rows as an aligned text table; columns are every key, in first-seen order."""
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return "" if value is None else str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)
