"""``e2e``: the training script's tokens/s, read from a finished run, vs its bare training step.

- The script's rate is the median ``tok_per_s`` of the run's ``metrics.jsonl`` train records,
  the first left out (warm-up, compilation). Records are read with ``nanoattn.logging.read_metrics``,
  which skips a torn last line, so a run killed mid-write still gives its rate.
- The bare step is the script's own: the model, optimizer and (compiled) loss module built by
  the functions the training loop uses, one update by ``nanoattn.train.step.optimizer_step`` with
  the run's batch, gradient accumulation, dtype and clipping, on random tokens. The difference
  is what the script adds around the step: data loading, logging, evaluations and checkpoints
  (excluded from its windows or not).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from nanoattn.bench.core import BenchConfig, Row, random_tokens, section, shape_text
from nanoattn.checkpoint import read_run_config
from nanoattn.config import RunConfig
from nanoattn.logging import read_metrics
from nanoattn.model import GPT
from nanoattn.runtime import autocast, autocast_dtype, compile_choice, synchronize
from nanoattn.train.optim import optimizer_for
from nanoattn.train.step import optimizer_step, wrap_for_training


def read_run_rate(run: str | Path) -> tuple[RunConfig, float, int]:
    """(the run's config, median tok_per_s of its train records after the first, records used)."""
    run = Path(run)
    config_file, metrics_file = run / "config.yaml", run / "metrics.jsonl"
    for file in (config_file, metrics_file):
        if not file.is_file():
            raise ValueError(f"bench.run={str(run)!r} is invalid: no {file.name} (pass a run directory)")
    cfg = RunConfig.from_dict(read_run_config(run))
    rates = [record["tok_per_s"] for record in read_metrics(metrics_file) if "tok_per_s" in record]
    # The first window holds the warm-up (and any compilation); later ones are the steady state.
    if len(rates) < 2:
        raise ValueError(f"bench.run={str(run)!r}: {metrics_file} has {len(rates)} train record(s); "
                         "need at least 2 (the first is warm-up)")
    return cfg, statistics.median(rates[1:]), len(rates) - 1


def step_rate(cfg: RunConfig, device: torch.device, reps: int, seconds: float) -> tuple[float, str, str]:
    """(tokens/s of the training script's optimizer step for ``cfg`` without the script; autocast;
    compilation).

    Timed like the script's records: windows of ``train.log_interval`` steps, at least ``reps``
    of them and at least ``seconds`` in all, after a warm-up window; the median window's rate.
    """
    t = cfg.train
    amp, reason = autocast_dtype(t.dtype, device)
    torch.manual_seed(t.seed)
    with device:
        model = GPT(cfg.model)
    model.train()
    optimizer = optimizer_for(model, t, device)
    compiled, compile_reason = compile_choice(t.compile, device)
    net = wrap_for_training(model, ddp=False, compile=compiled, device=device)
    shape = (t.batch_size, cfg.seq_len)
    batches = [(random_tokens(cfg.model.vocab_size, shape, device, seed=2 * m),  # [B, T]
                random_tokens(cfg.model.vocab_size, shape, device, seed=2 * m + 1))  # [B, T]
               for m in range(t.grad_accum)]

    def window() -> float:
        start = time.perf_counter()
        for _ in range(t.log_interval):
            optimizer_step(net, model, optimizer, batches, grad_clip=t.grad_clip,
                           autocast=lambda: autocast(device, amp))
        synchronize(device)
        return time.perf_counter() - start

    window()
    windows = [window()]
    while len(windows) < reps or sum(windows) < seconds:
        windows.append(window())
    rate = t.log_interval * t.batch_size * t.grad_accum * cfg.seq_len / statistics.median(windows)
    return rate, reason, compile_reason


@section("e2e")
def e2e_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """The training script's tokens/s (from ``run``) vs the bare training step at the same shape."""
    if cfg.run is None:
        return [dict(note="skipped: pass run=<run directory> (python scripts/train.py writes one)")]
    run_cfg, run_rate, windows = read_run_rate(cfg.run)
    rate, reason, compile_reason = step_rate(run_cfg, cfg.torch_device(), cfg.reps, cfg.e2e_seconds)
    m, t = run_cfg.model, run_cfg.train
    return [dict(run=str(cfg.run), shape=shape_text(m, t.batch_size * t.grad_accum, run_cfg.seq_len),
                 dtype=reason, compile=compile_reason, windows=windows, script_tok_per_s=run_rate,
                 step_tok_per_s=rate, script_vs_step=run_rate / rate)]
