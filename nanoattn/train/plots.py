"""Loss curves from a run's ``metrics.jsonl``.

matplotlib is imported inside the function (Agg backend, no display needed) so the library
imports without it. The x axis is tokens seen, which compares runs of different batch sizes.
"""

from __future__ import annotations

from pathlib import Path

from nanoattn.logging import read_metrics


def plot_loss_curve(run_dir: str | Path, out: str | Path | None = None, *, title: str | None = None) -> Path:
    """Plot train_loss and val_loss (nats/token) against tokens; returns the PNG's path.

    ``out`` defaults to ``<run_dir>/loss_curve.png``; the title defaults to the final val_bpb.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    records = read_metrics(run_dir / "metrics.jsonl")
    train = [(r["tokens"], r["train_loss"]) for r in records if "train_loss" in r]
    val = [(r["tokens"], r["val_loss"], r["val_bpb"]) for r in records if "val_loss" in r]
    if not train:
        raise ValueError(f"{run_dir / 'metrics.jsonl'} has no train_loss records to plot")
    out = Path(out) if out is not None else run_dir / "loss_curve.png"
    fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
    ax.plot([t / 1e6 for t, _ in train], [loss for _, loss in train], lw=1, label="train")
    if val:
        ax.plot([t / 1e6 for t, _, _ in val], [loss for _, loss, _ in val], "o-", ms=3, label="validation")
    ax.set_xlabel("tokens (millions)")
    ax.set_ylabel("loss (nats / token)")
    if title is None:
        title = f"final val_loss {val[-1][1]:.3f}, val_bpb {val[-1][2]:.3f}" if val else run_dir.name
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
