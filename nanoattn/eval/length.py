"""Perplexity at lengths past the training length (length extrapolation).

Design choices:

- Windows. A length L is scored with windows of L input tokens over one token stream. ``chunks``
  (Press et al. 2022) places them end to end, so each target sees only the context since its
  window began; ``sliding`` (the PI and YaRN papers) advances them by ``stride`` and scores only
  the last ``stride`` targets of each window after the first, so every target after the first
  window has at least ``L - stride`` tokens of context. Both are one routine: chunks is sliding
  with ``stride = L``. The default sliding stride is ``L // 2``.
- The same targets at every length. The stream is the first ``max_tokens + 1`` tokens of the
  held-out split (``n`` targets). Whatever the length, exactly these ``n`` targets are scored,
  each once: when ``L`` does not divide ``n`` (or the stride does not reach the end), one last
  window ends exactly at the stream's end and scores only the targets not scored yet. Those few
  targets get more context than a pure chunk would give them; the alternative, dropping the
  tail, would make lengths score different text. A length longer than the stream is an error
  entry, not a silently shorter window.
- Per-position loss: the mean loss at each position 0..L-1 over all windows of a length (every
  position of every window, scored or not), the "why" behind a perplexity: a flat curve that
  jumps after the training length is an encoding that does not extrapolate. With chunks and
  ``L`` dividing ``n``, its mean is exactly that length's loss.
- A length the model cannot run (learned positions past their table, which raise ValueError;
  CUDA out of memory) becomes an entry with ``ppl: null`` and an ``error`` string; the other
  lengths still run.
- Memory. Attention never builds ``[heads, T, T]``: without a bias it is SDPA with ``is_causal``;
  ALiBi's bias is built in query chunks (``model/attention.py``). ``peak_memory_bytes`` measures
  what one length's evaluation added on top of what was resident before it: on CUDA
  ``max_memory_allocated`` minus the allocation at the start; on Linux CPUs the peak resident set
  size (``VmHWM``, reset through ``/proc/self/clear_refs``) minus the resident size at the start,
  after returning freed heap pages to the OS (``malloc_trim``). The CPU number is therefore the
  process's real high-water mark (allocator slack and library buffers included), an upper bound
  on the tensors' own peak; elsewhere it is null.
- ``tok_per_s`` is scored targets per second of wall time for that length (what a user waits
  for); in sliding mode the model processes ``L / stride`` times more tokens than it scores.
"""

from __future__ import annotations

import ctypes
import gc
import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from nanoattn.checkpoint import LATEST, load_checkpoint, resolve_checkpoint
from nanoattn.data import TokenData, bits_per_byte
from nanoattn.validation import check_positive_int

MODES = ("chunks", "sliding")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_MULTIPLES = (1, 1.25, 1.5, 2, 4, 8, 16)
REPORT_STEM = "length_eval"  # <run dir>/length_eval[_<scaling>][_step<N>].json
DEFAULT_DATA_DIR = Path("data") / "shakespeare"
CLEAR_REFS = Path("/proc/self/clear_refs")  # Linux: writing "5" resets the peak RSS (VmHWM)
SMOOTH_POINTS = 32  # the per-position panel averages over about L / SMOOTH_POINTS positions


@dataclass
class LengthResult:
    """One length's numbers; ``loss`` is the mean next-token cross-entropy in nats."""

    length: int
    stride: int
    loss: float | None = None
    ppl: float | None = None
    bpb: float | None = None
    tokens: int = 0  # targets scored
    peak_memory_bytes: int | None = None
    tok_per_s: float | None = None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        values = asdict(self)
        if self.error is None:
            values.pop("error")
        return values


def window_starts(n_targets: int, length: int, stride: int) -> list[int]:
    """Start offsets of the windows scoring targets 1..n_targets; the last window ends at the stream's end."""
    last = n_targets - length
    starts = list(range(0, last + 1, stride))
    if starts[-1] != last:
        starts.append(last)
    return starts


@torch.no_grad()
def score_length(model, tokens: torch.Tensor, length: int, *, stride: int | None = None,
                 batch_size: int = 4, dtype: str = "float32") -> tuple[float, int, torch.Tensor]:
    """Score the targets ``tokens[1:]`` with windows of ``length`` inputs advanced by ``stride``.

    ``tokens`` is a 1-D int64 stream of n + 1 tokens; ``stride=None`` means chunks (= length).
    Returns (mean loss in nats over the n targets, n, per-position mean loss float64 [length]).
    """
    check_positive_int("length_eval", "length", length)
    check_positive_int("length_eval", "batch_size", batch_size)
    stride = length if stride is None else stride
    check_positive_int("length_eval", "stride", stride)
    if stride > length:
        raise ValueError(f"length_eval.stride={stride} is invalid: must be at most the length {length}")
    n_targets = tokens.numel() - 1
    if n_targets < length:
        raise ValueError(f"the evaluation stream has {n_targets} targets, fewer than one window of "
                         f"{length}; raise max_tokens or use a larger held-out split")
    device = next(model.parameters()).device
    tokens = tokens.to(device)
    starts = window_starts(n_targets, length, stride)
    total = torch.zeros((), dtype=torch.float64, device=device)
    per_position = torch.zeros(length, dtype=torch.float64, device=device)
    scored_until = 0  # targets 1..scored_until (stream offsets 0..scored_until-1) are scored
    with _autocast(device, dtype):
        for first in range(0, len(starts), batch_size):
            batch = starts[first:first + batch_size]
            windows = torch.stack([tokens[s:s + length + 1] for s in batch])  # [B, L + 1]
            losses = model.loss(windows[:, :-1], windows[:, 1:], reduction="none").double()  # [B, L]
            per_position += losses.sum(dim=0)
            for row, start in enumerate(batch):
                # Positions before scored_until - start were scored by earlier windows.
                total += losses[row, max(0, scored_until - start):].sum()
                scored_until = start + length
    return (total / n_targets).item(), n_targets, (per_position / len(starts)).cpu()


class LengthSweep(NamedTuple):
    results: list[LengthResult]
    per_position_loss: list[float]  # of the longest length that ran; empty if none did
    per_position_length: int | None


def evaluate_lengths(model, tokens: torch.Tensor, lengths: Sequence[int], *, mode: str = "chunks",
                     stride: int | None = None, batch_size: int = 4, dtype: str = "float32",
                     bytes_per_token: float | None = None) -> LengthSweep:
    """Every length scored on the same stream ``tokens`` (1-D int64, n + 1 tokens)."""
    if mode not in MODES:
        raise ValueError(f"length_eval.mode={mode!r} is invalid: allowed: {' | '.join(MODES)}")
    if dtype not in DTYPES:
        raise ValueError(f"length_eval.dtype={dtype!r} is invalid: allowed: {' | '.join(DTYPES)}")
    lengths = check_lengths(lengths)
    if mode == "chunks" and stride is not None:
        raise ValueError(f"length_eval.stride={stride} is invalid with mode='chunks' (windows do not "
                         "overlap); use mode=sliding or stride=null")
    if stride is not None:
        check_positive_int("length_eval", "stride", stride)
        if stride > lengths[0]:
            raise ValueError(f"length_eval.stride={stride} is invalid: must be at most the shortest length "
                             f"{lengths[0]}")
    device = next(model.parameters()).device
    results, per_position, per_position_length = [], [], None
    for length in lengths:
        window_stride = length if mode == "chunks" else stride or max(1, length // 2)
        result = LengthResult(length=length, stride=window_stride)
        memory = PeakMemory(device)
        try:
            with memory:
                began = time.perf_counter()
                loss, n, positions = score_length(model, tokens, length, stride=window_stride,
                                                  batch_size=batch_size, dtype=dtype)
                _synchronize(device)
                seconds = time.perf_counter() - began
        except (ValueError, torch.OutOfMemoryError) as e:
            result.error = str(e).splitlines()[0]
        else:
            result.loss, result.tokens, result.tok_per_s = loss, n, n / seconds
            result.ppl = math.exp(loss)
            result.bpb = None if bytes_per_token is None else bits_per_byte(loss, bytes_per_token)
            result.peak_memory_bytes = memory.bytes
            per_position, per_position_length = positions.tolist(), length
        results.append(result)
    return LengthSweep(results, per_position, per_position_length)


def check_lengths(lengths: Sequence[int]) -> list[int]:
    """Distinct positive integer lengths, ascending."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        raise ValueError(f"length_eval.lengths={lengths!r} is invalid: must be a non-empty list of lengths")
    for length in lengths:
        check_positive_int("length_eval", "lengths", length)
    return sorted(set(lengths))


def lengths_from_multiples(train_seq_len: int, multiples: Sequence[float] = DEFAULT_MULTIPLES) -> list[int]:
    """round(m * train_seq_len) for each multiple m (1, 1.25, ... 16 by default)."""
    if isinstance(multiples, (str, bytes)) or not isinstance(multiples, Sequence) or not multiples:
        raise ValueError(f"length_eval.multiples={multiples!r} is invalid: must be a non-empty list")
    for m in multiples:
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not m > 0:
            raise ValueError(f"length_eval.multiples={list(multiples)} is invalid: {m!r} is not positive")
    return check_lengths([max(1, round(m * train_seq_len)) for m in multiples])


class PeakMemory:
    """Context manager: ``bytes`` = peak memory added while inside it (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._base = torch.cuda.memory_allocated(self.device)
        elif self.device.type == "cpu" and CLEAR_REFS.exists():
            _malloc_trim()
            self._base = _proc_status("VmRSS")
            CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS
        else:
            self._base = None
        return self

    def __exit__(self, *exc) -> None:
        if self._base is None:
            return
        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _proc_status("VmHWM")
        self.bytes = max(0, peak - self._base)


def _proc_status(field: str) -> int:
    """A memory field of /proc/self/status (Linux), in bytes."""
    found = re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE)
    return int(found.group(1)) * 1024


def _malloc_trim() -> None:
    """Hand freed heap pages back to the OS (glibc), so the baseline RSS excludes earlier lengths' garbage."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _autocast(device: torch.device, dtype: str):
    if dtype == "float32":
        return torch.autocast(device_type=device.type, enabled=False)
    return torch.autocast(device_type=device.type, dtype=DTYPES[dtype])


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ----------------------------------------------------------------------------- from a checkpoint


def load_for_eval(ckpt: str | Path, rope_scaling: Mapping[str, Any] | None, device: str,
                  data_dir: str | Path | None):
    """(checkpoint with ``rope_scaling`` applied zero-shot, TokenData of ``data_dir`` or else the run's).

    Refuses data whose tokenizer is not the checkpoint's: its ids would mean other tokens.
    """
    rope_scaling = None if rope_scaling is None else dict(rope_scaling)
    checkpoint = load_checkpoint(ckpt, rope_scaling=rope_scaling, device=device)
    data_dir = Path(data_dir) if data_dir is not None else default_data_dir(checkpoint.path)
    data = TokenData(data_dir)
    if checkpoint.tokenizer is not None and checkpoint.tokenizer.to_str() != data.tokenizer.to_str():
        raise ValueError(f"data_dir={str(data_dir)!r} uses another tokenizer than checkpoint "
                         f"{checkpoint.path}; pass the data_dir the model was trained on")
    return checkpoint, data


def run_length_eval(
    ckpt: str | Path,
    *,
    lengths: Sequence[int] | None = None,
    multiples: Sequence[float] = DEFAULT_MULTIPLES,
    mode: str = "chunks",
    stride: int | None = None,
    max_tokens: int = 32768,
    batch_size: int = 4,
    dtype: str = "float32",
    device: str = "cpu",
    data_dir: str | Path | None = None,
    rope_scaling: Mapping[str, Any] | None = None,
    out: str | Path | None = None,
    plot: bool = True,
) -> dict[str, Any]:
    """Evaluate a checkpoint (or run directory) at several lengths; write the JSON report and its plot.

    ``lengths=None`` takes ``multiples`` of the checkpoint's training length. ``rope_scaling``
    applies a RoPE scaling zero-shot (its original length defaults to the training length).
    ``out=None`` writes ``length_eval[_<scaling>][_step<N>].json`` into the run directory (see
    ``default_output``). Returns the report.
    """
    check_positive_int("length_eval", "max_tokens", max_tokens)
    checkpoint, data = load_for_eval(ckpt, rope_scaling, device, data_dir)
    val = data.tokens("val")
    stream = torch.from_numpy(val[:min(max_tokens, val.size - 1) + 1].astype("int64"))  # [n + 1]
    if lengths is None:
        lengths = lengths_from_multiples(checkpoint.train_seq_len, multiples)
    sweep = evaluate_lengths(checkpoint.model, stream, lengths, mode=mode, stride=stride,
                             batch_size=batch_size, dtype=dtype, bytes_per_token=data.bytes_per_token)
    report = {
        "checkpoint": str(checkpoint.path),
        "step": checkpoint.step,
        "pos": checkpoint.config.pos,
        "train_seq_len": checkpoint.train_seq_len,
        "mode": mode,
        "stride": stride,
        "max_tokens": max_tokens,
        "data_dir": str(data_dir),
        "dtype": dtype,
        "device": str(device),
        "rope_scaling": checkpoint.config.rope_scaling,
        "rope_scaling_override": rope_scaling,
        "results": [r.to_dict() for r in sweep.results],
        "per_position_length": sweep.per_position_length,
        "per_position_loss": sweep.per_position_loss,
    }
    out = Path(out) if out is not None else default_output(ckpt, rope_scaling)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    if plot:
        plot_length_curves([report], [report_label(out)], out.with_suffix(".png"))
    return report


def run_directory(checkpoint_path: Path) -> Path:
    """The run directory of a checkpoint ``<run>/checkpoints/<name>``; else the checkpoint's parent."""
    parent = checkpoint_path.parent
    return parent.parent if parent.name == "checkpoints" else parent


def report_label(file: Path, stem: str = REPORT_STEM) -> str:
    """A report's name in plots and tables: its run directory, plus the file's suffix (``rope/yarn4``)."""
    suffix = file.stem.removeprefix(stem).lstrip("_")
    return file.parent.name + (f"/{suffix}" if suffix else "")


def scaling_tag(rope_scaling: Mapping[str, Any]) -> str:
    """A file-name tag for a scaling override: its type and factor, then other keys, e.g. ``yarn4``."""
    rest = {k: v for k, v in rope_scaling.items() if k not in ("type", "factor")}
    tag = f"{rope_scaling.get('type', '')}{_number_text(rope_scaling.get('factor', ''))}"
    tag += "".join(f"_{k}{_number_text(v)}" for k, v in sorted(rest.items()))
    return re.sub(r"[^A-Za-z0-9._-]", "", tag)


def default_output(ckpt: str | Path, rope_scaling: Mapping[str, Any] | None = None,
                   stem: str = REPORT_STEM) -> Path:
    """``<run dir>/<stem>.json``; ``_<scaling tag>`` with an override, ``_step<N>`` unless the latest.

    So zero-shot scalings and older checkpoints of one run never overwrite each other.
    """
    path = resolve_checkpoint(ckpt)
    if rope_scaling:
        stem += "_" + scaling_tag(rope_scaling)
    latest = path.parent / LATEST
    if latest.exists() and latest.read_text().strip() != path.name:
        stem += f"_step{json.loads((path / 'config.json').read_text()).get('step', path.name)}"
    return run_directory(path) / f"{stem}.json"


def default_data_dir(checkpoint_path: Path) -> Path:
    """``<data.root>/<data.name>`` from the run's config.yaml, else data/shakespeare (both from the cwd)."""
    import yaml

    config_file = run_directory(checkpoint_path) / "config.yaml"
    if config_file.exists():
        data = (yaml.safe_load(config_file.read_text()) or {}).get("data") or {}
        if data.get("root") and data.get("name"):
            return Path(data["root"]) / data["name"]
    return DEFAULT_DATA_DIR


def _number_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- pictures


def plot_length_curves(reports: Sequence[Mapping[str, Any]], labels: Sequence[str], path: str | Path) -> Path:
    """Perplexity vs length (log x, training length marked) and the longest length's loss by position."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from cycler import cycler

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    # Eleven distinct colours (the lab draws eleven curves), then the same dashed.
    styles = cycler(linestyle=["-", "--"]) * cycler(color=[*plt.get_cmap("tab10").colors, "black"])
    for axis in (left, right):
        axis.set_prop_cycle(styles)
    for report, label in zip(reports, labels, strict=True):
        scored = [r for r in report["results"] if r.get("ppl") is not None]
        left.plot([r["length"] for r in scored], [r["ppl"] for r in scored], marker="o", label=label)
        positions = report.get("per_position_loss") or []
        smooth = _moving_average(positions, max(1, len(positions) // SMOOTH_POINTS)) if positions else []
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
    plain = matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}")
    left.set_xticks(sorted({r["length"] for report in reports for r in report["results"]}))
    left.xaxis.set_major_formatter(plain)
    left.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
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
    plt.close(fig)
    return path


def _moving_average(values: Sequence[float], width: int) -> list[float]:
    """Mean of each run of ``width`` consecutive values, placed at the run's end (same length as values)."""
    series = torch.tensor(values, dtype=torch.float64)  # [L]
    sums = torch.cat([torch.zeros(1, dtype=torch.float64), series.cumsum(0)])  # [L + 1]
    ends = torch.arange(1, len(values) + 1)
    begins = (ends - width).clamp(min=0)
    return ((sums[ends] - sums[begins]) / (ends - begins)).tolist()
