"""Results pages: measurements over seeds as a JSON record, and the markdown page rendered from it.

Design choices:

- A record holds what reproduces and qualifies its numbers: the command that made it, the git
  commit (and whether the tree had uncommitted changes), the machine (CPU model, the flags that
  choose kernels, threads, torch), the date, the seeds and every seed's value of every cell.
  The summary is computed from those values, never stated beside them: each cell's mean and its
  95% interval, Student's t over the seeds (a cell measured on fewer than two seeds has no
  interval, and says so).
- A rate (exact match, retrieval: a column of ``Measure.rates``) gets an interval that stays in
  [0, 1]: Student t on the logit scale (``nanoattn.eval.claims.rate_interval``); the page says so.
- A paper's claim is a comparison of two rows on one column, checked as the paired comparison over
  the seeds both rows measured, and decided only where the lab has the power to detect the paper's
  effect (``nanoattn.eval.claims``): each finding states the paper's scale and effect, the lab's
  scale, the advantage measured and the minimum detectable effect. A length claim judged on the
  change from 1x puts that column beside the level on the page.
- A row may carry a status instead of numbers (a run not finished, a task not learned): its
  cells are kept in the record but shown as the status, and no claim is decided on it.
- ``render_page`` is a function of the record alone, so a page is regenerated from its JSON.
  ``write_page`` writes the JSON, the markdown and, if given, the figure beside them, under an
  exclusive lock of the folder, so two writers of one folder never interleave. They replace
  only an earlier page of the same name (``check_page_output``), never another file.
"""

from __future__ import annotations

import datetime
import json
import math
import shlex
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from nanoattn.eval.claims import (
    CONFIDENCE,
    Claim,
    Measure,
    advantage_text,
    cell_values,
    degradation_column,
    interval,
    judge,
    mde_text,
    paper_effect_text,
    rate_interval,
)
from nanoattn.eval.tables import format_table
from nanoattn.runtime import check_output, cpu_flags, cpu_name, exclusive_lock, json_object_with, write_atomic

# The flags that choose a CPU's kernels, and so its speed and its bf16 rounding.
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
REPO = Path(__file__).resolve().parents[2]  # the checkout of an editable install
PUBLISHED = "docs/results"  # where the results pages are published, relative to REPO


def machine() -> dict[str, Any]:
    """What moves the numbers: the CPU's model and kernel flags, threads, torch and Python."""
    flags = cpu_flags()
    return {"cpu": cpu_name(), "kernel_flags": [f for f in KERNEL_FLAGS if f in flags],
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": sys.version.split()[0]}


def git_state() -> dict[str, Any]:
    """The checkout's commit and whether it had uncommitted changes (None where it is no git checkout).

    The published pages (``PUBLISHED``) do not count: they compute nothing, and a lab started after
    another published its page is run by the committed code all the same."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=30)
        except OSError:
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){PUBLISHED}")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def command_line() -> str:
    """This process's command as a user would type it again."""
    script = Path(sys.argv[0])
    with_python = script.suffix == ".py"
    if with_python and script.is_absolute() and script.is_relative_to(Path.cwd()):
        script = script.relative_to(Path.cwd())
    return shlex.join(["python", str(script), *sys.argv[1:]] if with_python else sys.argv)


def provenance(page: str, title: str, about: str, command: str | None = None) -> dict[str, Any]:
    """What every page starts with: its name and prose, and what made it, where and when."""
    return {"page": page, "title": title, "about": about, "command": command or command_line(), **git_state(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "machine": machine()}


def record(page: str, title: str, about: str, seeds: Sequence[int],
           values: Mapping[str, Mapping[str, Sequence[float | None]]], *,
           claims: Sequence[Claim] = (), status: Mapping[str, str] | None = None,
           notes: Sequence[str] = (), command: str | None = None, measure: Measure | None = None,
           scales: Mapping[str, Mapping[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """The record of a page: ``values[row][column]`` holds one value per seed (None: not measured).

    ``status[row]`` replaces a row's numbers on the page (and keeps it out of every claim);
    ``notes`` are lines the page states below its table; ``measure`` says which columns are rates
    (and how many instances each value counts); ``scales[row]`` is what its runs trained (parameters,
    tokens, length), which each claim states beside the paper's.
    """
    status, scales, measure = dict(status or {}), dict(scales or {}), measure or Measure()
    degraded = list(dict.fromkeys(claim.column for claim in claims if claim.degradation))
    rows = []
    for label, columns in values.items():
        columns = {c: list(v) for c, v in columns.items()}
        for column, cells in columns.items():
            if len(cells) != len(seeds):
                raise ValueError(f"row {label!r} has {len(cells)} values of {column!r} for {len(seeds)} "
                                 "seeds")
        for column in degraded:  # beside the level, its change from 1x
            changed = cell_values({"values": columns}, column, degradation=True)
            if changed is not None:
                columns[degradation_column(column)] = changed
        rows.append({"label": label, "status": status.get(label), "values": columns,
                     "summary": {c: summarize(c, v, measure) for c, v in columns.items()},
                     **({"scale": dict(scales[label])} if label in scales else {})})
    return {**provenance(page, title, about, command), "seeds": list(seeds), "rows": rows,
            "rates": dict(measure.rates), "findings": judge(claims, rows, measure),
            **({"notes": list(notes)} if notes else {}), **extra}


def summarize(column: str, cells: Sequence[float | None], measure: Measure) -> dict[str, Any]:
    """A column's mean and 95% interval over the seeds measured (a rate's stays in [0, 1])."""
    measured = [x for x in cells if x is not None]
    if measure.is_rate(column):
        return rate_interval(measured, measure.rates[column])
    return interval(measured)


def number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "n/a" if value is None else str(value)
    if abs(value) >= 1000 or (abs(value) >= 100 and float(value).is_integer()):  # a count: 800, not 800.0
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 100 else f"{value:.3g}" if abs(value) >= 1 else f"{value:.3f}"


def cell(summary: Mapping[str, Any]) -> str:
    """``mean ± half-width`` (one seed: the value alone)."""
    if summary["mean"] is None:
        return "n/a"
    if summary["low"] is None:
        return number(summary["mean"])
    return f"{number(summary['mean'])} ± {number((summary['high'] - summary['low']) / 2)}"


def header_lines(page: Mapping[str, Any]) -> list[str]:
    """A page's title, prose, the command that regenerates it, and where and when it was made."""
    dirty = " (with uncommitted changes)" if page["dirty"] else ""
    lines = [f"# {page['title']}", "", page["about"], ""]
    measured = page.get("measured")
    if measured:  # values from an earlier page, judged again (a lab's values_from)
        lines += ["Generated from the JSON beside this page. Its values were measured by:", "",
                  "```bash", measured["command"], "```", "", *_origin_lines(measured),
                  "", "and its summaries and verdicts recomputed from them, nothing retrained, by:",
                  "", "```bash", page["command"], "```", "",
                  f"- commit `{page['commit']}`{dirty}, {page['date']}"]
        return lines
    return [*lines, "Generated from the JSON beside this page; regenerate with:", "",
            "```bash", page["command"], "```", "", *_origin_lines(page)]


def _origin_lines(page: Mapping[str, Any]) -> list[str]:
    """Where, when and how long a page's measurements were made."""
    facts = page["machine"]
    flags = ", ".join(facts["kernel_flags"]) or "none of " + ", ".join(KERNEL_FLAGS)
    dirty = " (with uncommitted changes)" if page["dirty"] else ""
    lines = [f"- commit `{page['commit']}`{dirty}, {page['date']}",
             f"- machine: {facts['cpu']} ({flags}), {facts['threads']} threads, torch {facts['torch']}"]
    if page.get("wall_seconds") is not None:
        minutes = page["wall_seconds"] / 60
        lines.append(f"- wall time: {minutes:.1f} minutes for this command (what it trained included; runs "
                     "it reused trained before it)")
    if page.get("trained_runs"):
        minutes = page["training_seconds"] / 60
        lines.append(f"- training: {minutes:.1f} minutes over its {page['trained_runs']} runs, each run's "
                     "log windows summed (its metrics.jsonl), evaluations left out")
    return lines


def seeds_line(seeds: Sequence[int], rates: Sequence[str] = ()) -> str:
    if len(seeds) < 2:
        return (f"- seed: {', '.join(map(str, seeds))}; one seed gives no interval, so each cell is that "
                "run's value and no claim can be decided")
    line = (f"- seeds: {', '.join(map(str, seeds))}; each cell is the mean ± the half-width of its "
            f"{CONFIDENCE:.0%} interval (Student t over the seeds)")
    if rates:
        shown = ", ".join(f"`{c}`" for c in rates)
        line += (f"; the rates ({shown}) take it on the logit scale, each seed's rate moved half an "
                 "instance inward, so it stays in [0, 1] (shown as low-high)")
    return line


def rate_cell(summary: Mapping[str, Any]) -> str:
    """A rate's ``mean (low-high)``: its interval is not symmetric."""
    if summary["mean"] is None:
        return "n/a"
    if summary["low"] is None:
        return number(summary["mean"])
    return f"{number(summary['mean'])} ({number(summary['low'])}-{number(summary['high'])})"


def scale_text(scale: Mapping[str, Any] | None) -> str:
    """What a row's runs trained: ``0.85M parameters, 0.52M tokens, trained at 128``."""
    if not scale:
        return "—"
    return (f"{scale['parameters'] / 1e6:.2g}M parameters, {scale['tokens'] / 1e6:.2g}M tokens, trained at "
            f"{scale['train_length']:,}")


def render_page(page: Mapping[str, Any]) -> str:
    """The markdown page of a record."""
    columns = list(dict.fromkeys(c for row in page["rows"] for c in row["values"]))
    rates = page.get("rates", {})
    with_status = any(row["status"] for row in page["rows"])
    header = ["row", *(["status"] if with_status else []), *columns]
    def shown(row: Mapping[str, Any], column: str) -> str:
        if column not in row["values"] or row["status"]:
            return "—"
        return (rate_cell if column in rates else cell)(row["summary"][column])

    rows = ([row["label"], *([row["status"] or ""] if with_status else []), *(shown(row, c) for c in columns)]
            for row in page["rows"])
    table = format_table(header, rows, "l" * (1 + with_status) + "r" * len(columns))
    lines = [*header_lines(page), seeds_line(page["seeds"], [c for c in columns if c in rates]), "",
             table.rstrip("\n")]
    if page.get("notes"):
        lines += ["", *page["notes"]]
    if page.get("not_run"):
        lines += ["", f"Not run by this command, of the lab's default rows: {', '.join(page['not_run'])}."]
    if page["findings"]:
        scales = {row["label"]: row.get("scale") for row in page["rows"]}
        rows = []
        for f in page["findings"]:
            measure = f.get("measure", "absolute")
            rows.append([f["paper"] + (" (control)" if f.get("control") else ""), f["statement"],
                         f"{f['better']} vs {f['worse']}, {f['column']}", f.get("paper_scale") or "—",
                         paper_effect_text(f.get("paper_effect"), measure) + (
                             f" ({f['source']})" if f.get("source") else ""),
                         scale_text(scales.get(f["better"])), advantage_text(f["difference"], measure),
                         mde_text(f.get("mde"), measure), f["verdict"]])
        header = ["paper", "claim", "compared", "paper's scale", "paper's effect", "this lab", "advantage",
                  "detectable", "verdict"]
        lines += ["", "## Against the papers", "",
                  "The advantage is the claimed-better row's, paired by seed (perplexities and logits: the "
                  "relative advantage, from the mean log ratio; rates: the difference), with its 95% "
                  "interval. `detectable` is the smallest advantage this lab detects at its seeds and "
                  "measured spread (a two-sided 5% test, 80% power). A verdict is given only where the "
                  "paper's effect is detectable: above zero agrees (in direction only where the interval "
                  "lies below the paper's effect); below zero, or an interval that holds zero and "
                  "excludes the paper's effect, disagrees; else inconclusive. A lab disagrees only beside "
                  "a positive control (marked) that it reproduces.", "",
                  format_table(header, rows, "lllllllrl").rstrip("\n")]
    if page.get("figure"):
        lines += ["", f"![{page['title']}]({page['figure']})"]
    return "\n".join(lines) + "\n"


def check_page_output(folder: str | Path, name: str, key: str = "out") -> Path:
    """``<folder>/<name>.json``, checked (``check_output``): ``folder`` a folder (never a file, nor a
    repository's root), the page new or an earlier page of that name, and its markdown and figure
    beside it only then."""
    check_output(folder, key, what=f"a results page ({name})", folder=True)
    file = Path(folder) / f"{name}.json"

    def ours(path: Path) -> bool:
        return json_object_with(path, ("page",)) and json.loads(path.read_text())["page"] == name

    return check_output(file, key, what=f"a results page ({name})", ours=ours,
                        beside=[file.with_suffix(".md"), file.with_suffix(".png")])


def write_page(folder: str | Path, page: Mapping[str, Any], figure: Callable[[Path], Any] | None = None,
               render: Callable[[Mapping[str, Any]], str] = render_page, key: str = "out") -> Path:
    """Write ``<folder>/<page>.json``, its markdown (``render``) and ``figure(<page>.png)``; the
    markdown's path. ``key`` names the folder's option in a refusal (``check_page_output``)."""
    folder = Path(folder)
    name = page["page"]
    with exclusive_lock(folder, f"the results folder {folder}", wait=True, reentrant=True):
        check_page_output(folder, name, key)
        if figure is not None:
            figure(folder / f"{name}.png")
            page = {**page, "figure": f"{name}.png"}
        write_atomic(folder / f"{name}.json", json.dumps(page, indent=1) + "\n")
        return write_atomic(folder / f"{name}.md", render(page))
