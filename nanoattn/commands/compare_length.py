"""``scripts/compare_length.py``: several length evaluations in one figure and one markdown table.

Each path is a ``length_eval*.json`` file or a run directory (then its ``length_eval.json``);
reading and tabulating them is ``nanoattn.eval.compare``, the figure ``nanoattn.eval.plots``.
``out`` and ``table`` replace only an earlier figure and table (``nanoattn.runtime.check_output``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nanoattn.eval.compare import is_length_table, length_table, length_table_caption, load_report
from nanoattn.eval.plots import is_figure, plot_length_curves
from nanoattn.eval.runs import is_path
from nanoattn.runtime import check_output, write_atomic
from nanoattn.validation import fail


@dataclass
class CompareLengthConfig:
    """Every key of ``scripts/compare_length.py``."""

    paths: list[str] | None = None  # required: length_eval JSON files or run directories: [runs/a,runs/b]
    labels: list[str] | None = None  # one per path; None: the run directory names (rope/yarn4 for a scaling)
    out: str = "length_compare.png"  # the figure
    table: str | None = None  # also write the markdown table to this file
    baseline: str | None = None  # a label: ratios to its perplexity at each length; None: to each run's 1x

    def __post_init__(self) -> None:
        own = "compare_length"
        if not isinstance(self.paths, (list, tuple)) or not self.paths:
            fail(own, "paths", self.paths, "required: a non-empty list of length_eval JSON files or run "
                 "directories, e.g. 'paths=[runs/a,runs/b]'")
        for path in self.paths:
            if not is_path(path):
                fail(own, "paths", list(self.paths), f"{path!r} is not a path")
        if self.labels is not None and (not isinstance(self.labels, (list, tuple))
                                        or len(self.labels) != len(self.paths)):
            fail(own, "labels", self.labels, f"must be a list of one label per path ({len(self.paths)})")
        if not is_path(self.out):
            fail(own, "out", self.out, "must be a file path")
        if self.table is not None and not is_path(self.table):
            fail(own, "table", self.table, "must be a file path or null")
        if self.table is not None and Path(self.table) == Path(self.out):
            fail(own, "table", self.table, "must be another file than out (the figure)")
        if self.baseline is not None and not isinstance(self.baseline, str):
            fail(own, "baseline", self.baseline, "must be one of the labels or null")


def compare_length(cfg: CompareLengthConfig) -> str:
    """The command: plot every run's curves into ``out``, print the table (also written to ``table``)."""
    out = check_output(cfg.out, "compare_length.out", what="a figure", ours=is_figure)
    if cfg.table is not None:
        check_output(cfg.table, "compare_length.table", what="a length table", ours=is_length_table)
    loaded = [load_report(p) for p in cfg.paths]
    labels = [str(name) for name in cfg.labels] if cfg.labels is not None else [name for name, _ in loaded]
    reports = [report for _, report in loaded]
    if cfg.baseline is not None and cfg.baseline not in labels:
        fail("compare_length", "baseline", cfg.baseline, f"must be one of the labels: {' | '.join(labels)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    plot_length_curves(reports, labels, out)
    table = length_table(reports, labels, cfg.baseline)
    if cfg.table is not None:
        write_atomic(cfg.table, table)
    print(length_table_caption(cfg.baseline) + table, end="")
    print(f"wrote {out}" + (f" and {cfg.table}" if cfg.table else ""))
    return table
