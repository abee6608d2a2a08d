"""``eval``: evaluation tokens/s and peak memory at 1x, 4x and 16x the training length, per encoding.

- Every encoding of ``EVAL_POSITIONS`` at the config's model shape with random weights, through
  ``nanoattn.eval.length.evaluate_lengths`` (one window per length), so the benchmark times the
  evaluation users run. An encoding with a learned length (``learned``) stops at 1x: it has no
  positions past its table (``ModelConfig.length_limit``).
- Tokens per second counts scored targets. Peak memory is ``nanoattn.eval.length.PeakMemory``: on
  a Linux CPU the process's resident high-water mark added during that length (allocator slack
  included), on CUDA the allocator's peak. The table gives it per scored token, which stays flat
  when memory is linear, and over the 1x length's (about 4 and 16 when linear, 16 and 256 when
  quadratic).
- Medians over ``reps`` sweeps of every length (one sweep with ``quick``).
"""

from __future__ import annotations

import dataclasses
import gc
import statistics
from collections.abc import Mapping

import torch

from nanoattn.bench.core import BenchConfig, Row, random_tokens, section
from nanoattn.eval.length import evaluate_lengths
from nanoattn.model import GPT
from nanoattn.positional import REGISTRY
from nanoattn.runtime import autocast, autocast_dtype

EVAL_POSITIONS = tuple(REGISTRY)  # every encoding, so each is seen to stay linear in memory
EVAL_MULTIPLES = (1, 4, 16)


@section("eval")
def eval_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Evaluation tokens/s and peak memory at 1x, 4x and 16x the training length, per encoding."""
    train_len = 64 if cfg.quick else cfg.seq_len
    lengths = [m * train_len for m in EVAL_MULTIPLES]
    stream = random_tokens(cfg.model.vocab_size, (lengths[-1] + 1,), cfg.torch_device())  # [16 L + 1]
    # PeakMemory runs gc.collect() per length; frozen, the objects that exist now (transformers'
    # thousands after the train section) are not walked again, which took 0.3 s a call here.
    gc.freeze()
    try:
        return [row for pos in EVAL_POSITIONS for row in _eval_rows(pos, stream, lengths, cfg)]
    finally:
        gc.unfreeze()


def _eval_rows(pos: str, stream: torch.Tensor, lengths: list[int], cfg: BenchConfig) -> list[Row]:
    """Median tok/s and peak memory per length over the sweeps."""
    train_len = lengths[0]
    torch.manual_seed(0)
    with stream.device:
        model = GPT(dataclasses.replace(cfg.model, pos=pos, max_seq_len=train_len, rope_scaling=None)).eval()
    limit = model.cfg.length_limit
    usable = [length for length in lengths if limit is None or length <= limit]
    amp, _ = autocast_dtype(cfg.dtype, stream.device)
    with torch.no_grad(), autocast(stream.device, amp):  # warm-up: rope tables, allocator
        model.loss(stream[None, :train_len], stream[None, 1:train_len + 1])
    sweeps = [evaluate_lengths(model, stream, usable, batch_size=1, dtype=cfg.dtype).results
              for _ in range(1 if cfg.quick else cfg.reps)]
    rows = []
    for results in zip(*sweeps, strict=True):
        failed = next((r.error for r in results if r.error is not None), None)
        if failed is not None:
            raise ValueError(f"eval at length {results[0].length} with pos={pos!r} failed: {failed}")
        peaks = [r.peak_memory_bytes for r in results]
        peak = None if None in peaks else statistics.median(peaks)
        rows.append(dict(pos=pos, length=results[0].length, multiple=results[0].length // train_len,
                         tok_per_s=statistics.median(r.tok_per_s for r in results),
                         peak_mib=None if peak is None else peak / 2**20,
                         bytes_per_token=None if peak is None else peak / results[0].length))
    first = rows[0]["peak_mib"]
    for row in rows:
        row["memory_vs_1x"] = None if not first or row["peak_mib"] is None else row["peak_mib"] / first
    return rows
