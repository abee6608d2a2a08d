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
- ``streaming`` is StreamingLLM's protocol (Xiao et al. 2023, ``score_streaming``): the whole
  stream goes through one cache of L tokens, ``n_sink`` sinks and the newest L - n_sink, so every
  target after the first L sees exactly that; ``n_sink=0`` is window attention with a rolling
  cache, the baseline the paper shows collapsing. It has no per-position curve.
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
- ``dtype`` is the runtime vocabulary (``auto | float32 | bfloat16 | float16``): weights stay
  float32, other dtypes are autocast by ``nanoattn.runtime``, as in training.
- This module measures models on token streams; loading a run, its data and writing its
  report is ``nanoattn.commands.eval_length``, the figures ``plots.py``.
"""

from __future__ import annotations

import ctypes
import gc
import math
import re
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch

from nanoattn.data import TokenData, bits_per_byte
from nanoattn.logging import with_progress
from nanoattn.model import StreamingCache, check_streamable
from nanoattn.runtime import DTYPES, autocast, autocast_dtype, synchronize
from nanoattn.validation import as_float, check_choice, check_positive_int, fail, is_int

MODES = ("chunks", "sliding", "streaming")
DEFAULT_MULTIPLES = (1, 1.25, 1.5, 2, 4, 8, 16)
REPORT_STEM = "length_eval"  # <run dir>/length_eval[_<scaling>][_step<N>].json
CLEAR_REFS = Path("/proc/self/clear_refs")  # Linux: writing "5" resets the peak RSS (VmHWM)


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
    with autocast(device, autocast_dtype(dtype, device)[0]):
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


@torch.no_grad()
def score_streaming(model, tokens: torch.Tensor, n_sink: int, window: int, *,
                    dtype: str = "float32") -> tuple[float, int]:
    """StreamingLLM's evaluation (Xiao et al. 2023): (mean loss in nats over the targets
    ``tokens[1:]``, their number), the stream fed through a ``StreamingCache`` of the first
    ``n_sink`` tokens and the newest ``window``: a cache-full at once, then one token at a time,
    so memory is fixed however long the stream and each target sees the sinks and the window.
    ``n_sink=0`` is plain window attention with a rolling cache, the paper's failing baseline."""
    check_positive_int("length_eval", "window", window)
    if not (is_int(n_sink) and n_sink >= 0):
        raise ValueError(f"length_eval.n_sink={n_sink!r} is invalid: must be an integer >= 0")
    device = next(model.parameters()).device
    amp, _ = autocast_dtype(dtype, device)
    cache = StreamingCache(model.cfg, 1, n_sink, window, device=device,
                           dtype=amp or next(model.parameters()).dtype)
    inputs, targets = tokens[None, :-1].to(device), tokens[None, 1:].to(device)  # [1, n]
    total, start = torch.zeros((), dtype=torch.float64, device=device), 0
    with autocast(device, amp):
        while start < inputs.shape[1]:
            stop = min(inputs.shape[1], start + cache.next_piece())
            logits = model(inputs[:, start:stop], cache=cache).float()  # [1, stop - start, V]
            total += torch.nn.functional.cross_entropy(logits[0], targets[0, start:stop], reduction="sum")
            start = stop
    return (total / inputs.shape[1]).item(), inputs.shape[1]


def held_out_stream(data: TokenData, max_tokens: int) -> torch.Tensor:
    """The first ``max_tokens + 1`` tokens of the held-out split (fewer if it is shorter), int64 [n + 1]."""
    check_positive_int("length_eval", "max_tokens", max_tokens)
    val = data.tokens("val")
    return torch.from_numpy(val[:min(max_tokens, val.size - 1) + 1].astype("int64"))


class LengthSweep(NamedTuple):
    results: list[LengthResult]
    per_position_loss: list[float]  # of the longest length that ran; empty if none did
    per_position_length: int | None


def evaluate_lengths(model, tokens: torch.Tensor, lengths: Sequence[int], *, mode: str = "chunks",
                     stride: int | None = None, batch_size: int = 4, dtype: str = "float32",
                     bytes_per_token: float | None = None, n_sink: int = 4) -> LengthSweep:
    """Every length scored on the same stream ``tokens`` (1-D int64, n + 1 tokens); in streaming
    mode a length is the cache's size, ``n_sink`` of it sinks."""
    check_choice("length_eval", "mode", mode, MODES)
    check_choice("length_eval", "dtype", dtype, DTYPES)
    lengths = check_lengths("length_eval", lengths)
    if mode != "sliding" and stride is not None:
        raise ValueError(f"length_eval.stride={stride} is invalid with mode={mode!r} (only sliding windows "
                         "overlap); use mode=sliding or stride=null")
    if mode == "streaming":
        check_streamable(model.cfg, "length_eval", "mode", mode)
    if mode == "streaming" and lengths[0] <= n_sink:
        raise ValueError(f"length_eval.lengths={lengths} is invalid with mode='streaming': each is a cache "
                         f"of n_sink={n_sink} sinks plus a window, so it must exceed n_sink")
    if stride is not None:
        check_positive_int("length_eval", "stride", stride)
        if stride > lengths[0]:
            raise ValueError(f"length_eval.stride={stride} is invalid: must be at most the shortest length "
                             f"{lengths[0]}")
    device = next(model.parameters()).device
    results, per_position, per_position_length = [], [], None
    for length in with_progress(lengths, f"length_eval ({mode})"):
        window_stride = length if mode == "chunks" else stride or max(1, length // 2)
        result = LengthResult(length=length, stride=window_stride)
        memory = PeakMemory(device)
        try:
            with memory:
                began = time.perf_counter()
                if mode == "streaming":
                    loss, n = score_streaming(model, tokens, n_sink, length - n_sink, dtype=dtype)
                    positions = None
                else:
                    loss, n, positions = score_length(model, tokens, length, stride=window_stride,
                                                      batch_size=batch_size, dtype=dtype)
                synchronize(device)
                seconds = time.perf_counter() - began
        except (ValueError, torch.OutOfMemoryError) as e:
            result.error = str(e).splitlines()[0]
        else:
            result.loss, result.tokens, result.tok_per_s = loss, n, n / seconds
            result.ppl = math.exp(loss)
            result.bpb = None if bytes_per_token is None else bits_per_byte(loss, bytes_per_token)
            result.peak_memory_bytes = memory.bytes
            if positions is not None:
                per_position, per_position_length = positions.tolist(), length
        results.append(result)
    return LengthSweep(results, per_position, per_position_length)


def check_lengths(owner: str, lengths: Sequence[int]) -> list[int]:
    """Distinct positive integer lengths, ascending."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Sequence) or not lengths:
        fail(owner, "lengths", lengths, "must be a non-empty list of lengths")
    for length in lengths:
        check_positive_int(owner, "lengths", length)
    return sorted(set(lengths))


def check_multiples(owner: str, multiples: Sequence[float]) -> None:
    """A non-empty list of positive finite numbers (multiples of a training length)."""
    if isinstance(multiples, (str, bytes)) or not isinstance(multiples, Sequence) or not multiples:
        fail(owner, "multiples", multiples, "must be a non-empty list")
    for m in multiples:
        if not (as_float(m) > 0 and math.isfinite(as_float(m))):
            fail(owner, "multiples", list(multiples), f"{m!r} is not a positive finite number")


def lengths_from_multiples(train_seq_len: int, multiples: Sequence[float] = DEFAULT_MULTIPLES,
                           owner: str = "length_eval") -> list[int]:
    """round(m * train_seq_len) for each multiple m (1, 1.25, ... 16 by default)."""
    check_multiples(owner, multiples)
    lengths = [m * train_seq_len for m in multiples]
    if not all(math.isfinite(length) for length in lengths):
        fail(owner, "multiples", list(multiples), f"x the training length {train_seq_len} is past any length")
    return check_lengths(owner, [max(1, round(length)) for length in lengths])


class PeakMemory:
    """Context manager: ``bytes`` = peak memory added while inside it (see the module docstring)."""

    def __init__(self, device: torch.device) -> None:
        self.device = torch.device(device)
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        gc.collect()
        if self.device.type == "cuda":
            synchronize(self.device)
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
