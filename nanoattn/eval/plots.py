"""Every figure of the evaluation layer: length curves, passkey heat maps, attention heads.

Design choices:

- Figures are built with matplotlib's object API (``matplotlib.figure.Figure``), never pyplot:
  no global figure state, no backend to select, and nothing left open between calls; ``savefig``
  renders with Agg. Each function saves to ``path``.
- Length curves: perplexity against length on a log x axis with the training lengths dashed, and
  the longest length's loss by position, smoothed (``SMOOTH_POINTS``). Eleven distinct colours,
  then the same dashed, so the lab's eleven curves stay apart.
- Passkey: one length x depth heat map per report, grey where the model cannot run a length.
- Tasks: exact-match accuracy against size (a factor of the training length), a panel per task
  and a curve per label in the same style in every panel, so an encoding is one colour throughout.
- Heads: a grid of every head's map, one head at full size with its tokens, the importance
  heatmap labelled with each head's kind, and the pruning curve.
- A figure is recognised as ours (``is_figure``, so a command replaces only its own) by the
  maker matplotlib writes into every PNG, PDF and SVG it saves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import numpy as np
import torch
from cycler import cycler
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

# Eleven distinct colours solid, then the same dashed: one style per curve of a lab.
CURVE_STYLES = cycler(linestyle=["-", "--"]) * cycler(color=[*matplotlib.colormaps["tab10"].colors, "black"])
SMOOTH_POINTS = 32  # the per-position panel averages over about L / SMOOTH_POINTS positions
# Per-head maps label their axes with the tokens up to this length; longer ones would be unreadable.
MAX_LABELLED_TOKENS = 96
MAKER_SPAN = 4096  # matplotlib names itself in the first (PNG, SVG) or last (PDF) bytes of its files


# ----------------------------------------------------------------------------- length and passkey


def is_figure(path: Path) -> bool:
    """True when ``path`` is a figure matplotlib saved (its maker in the file's first or last bytes)."""
    try:
        with open(path, "rb") as f:
            head = f.read(MAKER_SPAN)
            f.seek(max(0, f.seek(0, 2) - MAKER_SPAN))
            tail = f.read()
    except OSError:
        return False
    return b"matplotlib" in head.lower() or b"matplotlib" in tail.lower()


def plot_length_curves(reports: Sequence[Mapping[str, Any]], labels: Sequence[str], path: str | Path) -> Path:
    """Perplexity vs length (log x, training length marked) and the longest length's loss by position."""
    fig = Figure(figsize=(13, 4.5))
    left, right = fig.subplots(1, 2)
    for axis in (left, right):
        axis.set_prop_cycle(CURVE_STYLES)
    for report, label in zip(reports, labels, strict=True):
        scored = [r for r in report["results"] if r.get("ppl") is not None]
        left.plot([r["length"] for r in scored], [r["ppl"] for r in scored], marker="o", label=label)
        positions = report.get("per_position_loss") or []
        smooth = moving_average(positions, max(1, len(positions) // SMOOTH_POINTS)) if positions else []
        right.plot(range(len(smooth)), smooth, label=label, linewidth=1.2)  # empty keeps the styles paired
    train_lengths = sorted({r["train_seq_len"] for r in reports})
    for axis in (left, right):
        for length in train_lengths:
            axis.axvline(length, color="gray", linestyle="--", linewidth=1)
    ppls = [r["ppl"] for report in reports for r in report["results"] if r.get("ppl") is not None]
    # Log y only when perplexities span more than a factor 10 (an exploding encoding): a narrower
    # range would show no labelled decade at all.
    wide = bool(ppls) and max(ppls) > 10 * min(ppls)
    left.set(xscale="log", yscale="log" if wide else "linear", xlabel="evaluation length (tokens)",
             ylabel="perplexity", title="perplexity vs length (dashed: training length)")
    plain = FuncFormatter(lambda value, _: f"{value:g}")
    left.set_xticks(sorted({r["length"] for report in reports for r in report["results"]}))
    left.xaxis.set_major_formatter(plain)
    left.xaxis.set_minor_formatter(NullFormatter())
    left.yaxis.set_major_formatter(plain)
    left.tick_params(axis="x", labelrotation=45)
    longest = max((r.get("per_position_length") or 0) for r in reports)
    right.set(xlabel="token position in the window", ylabel="loss (nats), moving average",
              title=f"loss by position, longest length ({longest} tokens)")
    for axis in (left, right):
        axis.grid(True, which="both", alpha=0.3)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    fig.legend(*left.get_legend_handles_labels(), loc="center right", fontsize=8)
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def plot_tasks(reports: Sequence[Mapping[str, Any]], labels: Sequence[str], path: str | Path) -> Path:
    """Exact match vs size / training length: a panel per task, a curve per label (missing bins skipped)."""
    tasks = list(dict.fromkeys(report["task"]["name"] for report in reports))
    styles = dict(zip(dict.fromkeys(labels), itertools.cycle(CURVE_STYLES)))
    columns = min(3, len(tasks))
    fig = Figure(figsize=(4.3 * columns, 3.3 * math.ceil(len(tasks) / columns)), layout="constrained")
    axes = list(fig.subplots(math.ceil(len(tasks) / columns), columns, squeeze=False).flat)
    for axis, task in zip(axes, tasks, strict=False):  # a grid has as many or more panels
        for report, label in zip(reports, labels, strict=True):
            if report["task"]["name"] == task:
                scored = [b for b in report["results"] if b.get("exact") is not None]
                axis.plot([b["factor"] for b in scored], [b["exact"] for b in scored], marker="o",
                          label=label, **styles[label])
        axis.axvline(1.0, color="gray", linestyle="--", linewidth=1)
        axis.set(title=task, xlabel="size / training length", ylabel="exact match", ylim=(-0.03, 1.03))
    for axis in axes[len(tasks):]:
        axis.set_visible(False)
    handles = {label: handle for axis in fig.axes
               for handle, label in zip(*axis.get_legend_handles_labels(), strict=True)}
    fig.legend(handles.values(), handles.keys(), loc="outside right center")
    fig.savefig(path, dpi=100)
    return Path(path)


def moving_average(values: Sequence[float], width: int) -> list[float]:
    """Mean of each run of ``width`` consecutive values, placed at the run's end (same length as values)."""
    series = torch.tensor(values, dtype=torch.float64)  # [L]
    sums = torch.cat([torch.zeros(1, dtype=torch.float64), series.cumsum(0)])  # [L + 1]
    ends = torch.arange(1, len(values) + 1)
    begins = (ends - width).clamp(min=0)
    return ((sums[ends] - sums[begins]) / (ends - begins)).tolist()


def plot_passkey(reports: Sequence[Mapping[str, Any]], labels: Sequence[str], path: str | Path) -> Path:
    """One length x depth heat map of exact-match accuracy per report (grey: the model cannot run it)."""
    columns = min(len(reports), 3)
    rows = math.ceil(len(reports) / columns)
    # Constrained layout: titles and tick labels of neighbours never overlap.
    fig = Figure(figsize=(4.6 * columns, 3.8 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False)
    for axis in axes.flat[len(reports):]:
        axis.set_visible(False)
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgray")
    for axis, report, label in zip(axes.flat, reports, labels, strict=False):
        lengths = sorted({c["length"] for c in report["results"]})
        depths = sorted({c["depth"] for c in report["results"]})
        grid = np.full((len(depths), len(lengths)), np.nan)  # [depth, length]
        for cell in report["results"]:
            if cell.get("accuracy") is not None:
                grid[depths.index(cell["depth"]), lengths.index(cell["length"])] = cell["accuracy"]
        image = axis.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto", origin="lower")
        for (i, j), value in np.ndenumerate(grid):
            if not np.isnan(value):
                axis.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                          color="white" if value < 0.5 else "black")
        axis.set_xticks(range(len(lengths)), [f"{n:g}" for n in lengths], rotation=45)  # a mean: 128.0
        axis.set_yticks(range(len(depths)), [f"{d:g}" for d in depths])
        axis.set(xlabel="context length (tokens)", ylabel="key depth",
                 title=f"{label} (trained at {report['train_seq_len']})")
    fig.colorbar(image, ax=axes, shrink=0.6, label="exact-match accuracy")
    path = Path(path)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path


# ----------------------------------------------------------------------------- heads


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each id decoded on its own, with newlines shown as \\n and '$' escaped from matplotlib's mathtext."""
    texts = tokenizer.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)
    return [text.replace("\n", "\\n").replace("$", r"\$") for text in texts]


def plot_attention_grid(maps: torch.Tensor, path: str | Path, titles: Sequence[str] | None = None) -> Figure:
    """One panel per layer (rows) x head (columns) of maps [n_layer, n_head, T, T]; colours per panel."""
    n_layer, n_head = maps.shape[:2]
    fig = Figure(figsize=(1.8 * n_head + 0.4, 1.8 * n_layer + 0.4), layout="constrained")
    axes = fig.subplots(n_layer, n_head, squeeze=False)
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer, head]
            ax.imshow(maps[layer, head].cpu().numpy(), cmap="viridis", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(titles[layer * n_head + head] if titles else f"L{layer} H{head}", fontsize=7)
    fig.savefig(path, dpi=110)
    return fig


def plot_attention_head(weights: torch.Tensor, path: str | Path, title: str,
                        tokens: Sequence[str] | None = None) -> Figure:
    """One head's weights [T, T] at full size, axes labelled with the tokens when T is small enough."""
    T = weights.shape[-1]
    fig = Figure(figsize=(9, 8), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(weights.cpu().numpy(), cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    if tokens is not None and T <= MAX_LABELLED_TOKENS:
        ax.set_xticks(range(T), tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(T), tokens, fontsize=6)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.savefig(path, dpi=150)
    return fig


def plot_importance(heads: Sequence[Mapping[str, Any]], n_layer: int, n_head: int, path: str | Path,
                    method: str) -> Figure:
    """Importance as a layer x head heatmap, each cell annotated with the head's kind."""
    grid = torch.zeros(n_layer, n_head)
    for record in heads:
        grid[record["layer"], record["head"]] = record["importance"]
    fig = Figure(figsize=(1.3 * n_head + 2, 0.8 * n_layer + 1.2), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid.numpy(), cmap="magma", aspect="auto")
    fig.colorbar(image, ax=ax, label=f"importance ({method})")
    middle = float(grid.min() + grid.max()) / 2
    for record in heads:  # dark text on the bright cells of magma, light text on the dark ones
        ax.text(record["head"], record["layer"], f"{record['kind']}\n{record['importance']:.3g}", ha="center",
                va="center", fontsize=7, color="black" if record["importance"] > middle else "white")
    ax.set_xticks(range(n_head))
    ax.set_yticks(range(n_layer))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.savefig(path, dpi=120)
    return fig


def plot_pruning(curve: Sequence[Mapping[str, Any]], path: str | Path, scope: str, method: str) -> Figure:
    """Validation loss against the fraction of heads pruned, with the unpruned loss as a line."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot([r["fraction"] for r in curve], [r["loss"] for r in curve], marker="o")
    ax.axhline(curve[0]["loss"], color="gray", linestyle="--", label="unpruned")
    ax.set_xlabel(f"fraction of heads pruned ({scope}, by {method} importance)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    return fig
