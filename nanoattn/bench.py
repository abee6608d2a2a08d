"""Benchmarks: nanoattn side by side with transformers on the same machine, and against the hardware.

``scripts/bench.py`` is a thin command line over this module. Each section is a function
registered with ``@section(name)``: it takes the ``BenchOptions`` and the rows of the sections
already run, and returns rows (flat dicts) that the script prints as one table and writes as JSON.

Design choices:
- Side by side, alternating: implementations compared with each other run in one process, one
  repetition of each in turn, and each reports the median of its repetitions after untimed
  warm-up rounds (compilation, allocator, autocast's weight casts). Load from other processes
  then hits both alike, so the ratios hold on a shared machine where absolute numbers do not.
- The same work: the transformers model is nanoattn's own weights exported with
  ``nanoattn.hf.export_hf`` (so the shapes cannot drift apart) and loaded with SDPA attention.
  Its loss gets ``shift_labels`` = our targets, so both predict B x T tokens from the same B x T
  inputs (``labels`` alone shifts them and predicts T - 1 per row); both train with the same
  fused AdamW, and their losses on the initial weights (``initial_loss``) show that they
  compute the same function.
- Tokens per second is wall time: training counts input tokens per optimizer step; decoding
  counts generated tokens, prefill included; evaluation counts scored targets.
- MFU is ``GPT.flops_per_token`` (6 x matmul weights + the full T x T attention, PaLM's count)
  times tokens/s over the machine's matmul peak, measured in the same run as the fastest of
  ``reps`` 2048^3 matmuls in that dtype (not a datasheet's number).
- Peak memory in ``eval`` is ``nanoattn.eval.length.PeakMemory``: on a Linux CPU the process's
  resident high-water mark added during that length (allocator slack included), on CUDA the
  allocator's peak; the table gives it per scored token, which stays flat when memory is linear.
- ``e2e`` reads a finished run's ``metrics.jsonl`` and times the same training step (model,
  batch, gradient accumulation, dtype, compile, clipping, AdamW groups) without the training
  script around it, so the difference is what the script adds: data loading, logging, evals
  and checkpoints excluded from its windows or not.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from nanoattn.checkpoint import load_checkpoint
from nanoattn.config import ModelConfig, RunConfig, preset
from nanoattn.generate import Decoding, generate
from nanoattn.model import GPT

Row = dict[str, Any]
Section = Callable[["BenchOptions", Mapping[str, list[Row]]], list[Row]]
SECTIONS: dict[str, Section] = {}

EVAL_POSITIONS = ("sinusoidal", "rope", "alibi", "nope", "learned")
EVAL_MULTIPLES = (1, 4, 16)
PEAK_MATMUL = 2048  # n of the n x n x n matmul whose rate is the peak (quick: half, 8x less work)
TRAIN_DTYPES = ("float32", "bfloat16")


@dataclass
class BenchOptions:
    """What the sections measure. ``model``, ``batch_size`` and ``seq_len`` shape train, mfu and eval."""

    quick: bool = False
    reps: int = 5
    device: str = "cpu"
    dtype: str = "float32"  # decode and eval: float32, or bfloat16 under autocast
    model: ModelConfig = dataclasses.field(default_factory=lambda: preset("llama-small"))
    batch_size: int = 8
    seq_len: int = 256
    compile: bool = False  # train: also time torch.compile'd steps (tens of seconds to compile each)
    ckpt: str | None = None  # decode: a checkpoint or run directory instead of a random decode_model
    decode_model: ModelConfig = dataclasses.field(default_factory=lambda: preset("llama-tiny"))
    run: str | None = None  # e2e: the run directory to compare with
    e2e_seconds: float = 30.0  # e2e: time the bare step for at least this long

    def __post_init__(self) -> None:
        if isinstance(self.reps, bool) or not isinstance(self.reps, int) or self.reps < 1:
            raise ValueError(f"bench.reps={self.reps!r} is invalid: must be a positive integer")
        if self.dtype not in TRAIN_DTYPES:
            raise ValueError(f"bench.dtype={self.dtype!r} is invalid: allowed: {' | '.join(TRAIN_DTYPES)}")
        for name in ("batch_size", "seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"bench.{name}={value!r} is invalid: must be a positive integer")


def section(name: str) -> Callable[[Section], Section]:
    def register(fn: Section) -> Section:
        SECTIONS[name] = fn
        return fn
    return register


def run_sections(names: Iterable[str], opts: BenchOptions,
                 on_done: Callable[[str, list[Row]], None] | None = None) -> dict[str, list[Row]]:
    """Run the named sections in order; each row gets its section's name first."""
    done: dict[str, list[Row]] = {}
    for name in names:
        if name not in SECTIONS:
            raise ValueError(f"bench section {name!r} is unknown; allowed: {' | '.join(SECTIONS)}")
        done[name] = [{"section": name, **row} for row in SECTIONS[name](opts, done)]
        if on_done is not None:
            on_done(name, done[name])
    return done


# ----------------------------------------------------------------------------- timing


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def alternate(fns: Mapping[str, Callable[[], Any]], reps: int, device: torch.device,
              warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each fn, the fns called in turn ``reps`` times after ``warmup`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            _sync(device)
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def _autocast(device: torch.device, dtype: str):
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=getattr(torch, dtype))


def _random_tokens(vocab_size: int, shape: tuple[int, ...], device: torch.device, seed: int = 0):
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _layout(n_head: int, n_kv_head: int) -> str:
    return "MHA" if n_kv_head == n_head else "MQA" if n_kv_head == 1 else f"GQA-{n_head // n_kv_head}"


def _transformers_twin(model: GPT, device: torch.device):
    """transformers' AutoModelForCausalLM with ``model``'s weights (exported with nanoattn.hf)."""
    try:
        import transformers
    except ImportError:
        raise ValueError("transformers is not installed; the comparison needs it: "
                         "pip install -e '.[dev]'") from None
    from nanoattn.hf import export_hf

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hf(model, Path(tmp) / "hf")
        twin = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa",
                                                                 dtype=torch.float32)
    return twin.to(device)


# ----------------------------------------------------------------------------- train


class _Stepper:
    """One training step of a model (forward, backward, fused AdamW), optionally compiled."""

    def __init__(self, loss_fn: Callable, params, device: torch.device, compiled: bool) -> None:
        self.loss_fn = torch.compile(loss_fn) if compiled else loss_fn
        self.optimizer = torch.optim.AdamW(params, lr=1e-4, fused=device.type in ("cpu", "cuda"))
        self.device = device

    def __call__(self, x: torch.Tensor, y: torch.Tensor, dtype: str) -> None:
        with _autocast(self.device, dtype):
            loss = self.loss_fn(x, y)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def _train_rows(opts: BenchOptions) -> list[Row]:
    device = torch.device(opts.device)
    torch.manual_seed(0)
    with device:
        ours = GPT(opts.model).train()
    theirs = _transformers_twin(ours, device).train()
    B, T = opts.batch_size, opts.seq_len
    x = _random_tokens(opts.model.vocab_size, (B, T), device, seed=1)  # [B, T]
    y = _random_tokens(opts.model.vocab_size, (B, T), device, seed=2)  # [B, T]

    def theirs_loss(inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return theirs(input_ids=inputs, labels=targets, shift_labels=targets).loss

    loss_fns = {"nanoattn": (ours.loss, ours), "transformers": (theirs_loss, theirs)}
    with torch.no_grad():  # the same weights, so the same loss: they compute the same function
        initial = {impl: fn(x, y).item() for impl, (fn, _) in loss_fns.items()}
    variants = [(impl, compiled) for compiled in ((False, True) if opts.compile else (False,))
                for impl in loss_fns]
    steppers = {(impl, compiled): _Stepper(fn, module.parameters(), device, compiled)
                for impl, compiled in variants for fn, module in [loss_fns[impl]]}
    flops = ours.flops_per_token(T)
    rows = []
    for dtype in TRAIN_DTYPES:
        seconds = alternate({key: (lambda s=s, dtype=dtype: s(x, y, dtype)) for key, s in steppers.items()},
                            opts.reps, device, warmup=2 if opts.compile else 1)
        baseline = B * T / seconds[("transformers", False)]
        for (impl, compiled), s in seconds.items():
            rate = B * T / s
            rows.append(dict(impl=impl + (" + compile" if compiled else ""), dtype=dtype,
                             shape=_shape(opts.model, B, T), initial_loss=initial[impl], step_ms=1000 * s,
                             tok_per_s=rate, vs_transformers=rate / baseline, flops_per_token=flops))
    return rows


def _shape(cfg: ModelConfig, batch: int | None = None, seq_len: int | None = None) -> str:
    text = f"d{cfg.d_model} L{cfg.n_layer} H{cfg.n_head}/{cfg.n_kv_head} ff{cfg.ffn_dim} V{cfg.vocab_size}"
    return text if batch is None else f"{text} B{batch} T{seq_len}"


@section("train")
def train_section(opts: BenchOptions, done: Mapping[str, list[Row]]) -> list[Row]:
    """Training-step tokens/s, nanoattn vs transformers' Llama of the same shape, fp32 and bf16."""
    return _train_rows(opts)


# ----------------------------------------------------------------------------- mfu


def matmul_peak(dtype: str, device: torch.device, reps: int, n: int = PEAK_MATMUL) -> float:
    """FLOP/s of an n x n x n matmul in ``dtype``: the fastest of ``reps`` runs after a warm-up.

    The fastest, not the median: a peak is what the machine can do, and other processes only
    ever slow a run down.
    """
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype),
                        generator=torch.Generator(device).manual_seed(i)) for i in (0, 1))
    seconds = []
    for run in range(reps + 1):
        start = time.perf_counter()
        a @ b
        _sync(device)
        if run:
            seconds.append(time.perf_counter() - start)
    return 2 * n**3 / min(seconds)


@section("mfu")
def mfu_section(opts: BenchOptions, done: Mapping[str, list[Row]]) -> list[Row]:
    """Model FLOPs utilisation of every train row against the measured matmul peak of its dtype."""
    device = torch.device(opts.device)
    train_rows = done.get("train") or _train_rows(opts)
    n = PEAK_MATMUL // 2 if opts.quick else PEAK_MATMUL
    peaks = {dtype: matmul_peak(dtype, device, opts.reps, n) for dtype in TRAIN_DTYPES}
    rows = [dict(impl=f"matmul {n}^3", dtype=dtype, gflop_per_s=peak / 1e9) for dtype, peak in peaks.items()]
    for row in train_rows:
        achieved = row["flops_per_token"] * row["tok_per_s"]
        rows.append(dict(impl=row["impl"], dtype=row["dtype"], gflop_per_s=achieved / 1e9,
                         mfu=achieved / peaks[row["dtype"]]))
    return rows


# ----------------------------------------------------------------------------- decode


def _sampled_rate(model: GPT, prompt: torch.Tensor, new_tokens: int, use_cache: bool,
                  opts: BenchOptions) -> tuple[float, int]:
    """(generated tokens/s, prefill included, sampling at temperature 1; KV-cache bytes)."""
    device = prompt.device
    cache_bytes = 0

    def run() -> None:
        nonlocal cache_bytes
        with _autocast(device, opts.dtype):
            decoding = Decoding(model, prompt, new_tokens, use_cache=use_cache,
                                generator=torch.Generator(device=device).manual_seed(0))
            for _ in decoding:
                pass
        cache_bytes = decoding.kv_cache_bytes

    seconds = alternate({"decode": run}, opts.reps, device)["decode"]
    return prompt.shape[0] * new_tokens / seconds, cache_bytes


def _greedy_rows(model: GPT, twin, name: str, prompt_len: int, new_tokens: int,
                 opts: BenchOptions) -> list[Row]:
    """nanoattn.generate vs transformers' generate (``twin``), greedy, on the same weights and prompts."""
    device = model.tok_emb.weight.device
    rows = []
    for batch in (1, 8):
        prompt = _random_tokens(model.cfg.vocab_size, (batch, prompt_len), device)
        mask = torch.ones_like(prompt)
        out: dict[str, torch.Tensor] = {}

        def ours(prompt=prompt, out=out) -> None:
            with _autocast(device, opts.dtype):
                out["nanoattn"] = generate(model, prompt, new_tokens, temperature=0)

        def theirs(prompt=prompt, mask=mask, out=out) -> None:
            with torch.inference_mode(), _autocast(device, opts.dtype):
                out["transformers"] = twin.generate(prompt, attention_mask=mask, do_sample=False,
                                                    max_new_tokens=new_tokens, min_new_tokens=new_tokens)

        seconds = alternate({"nanoattn": ours, "transformers": theirs}, opts.reps, device)
        differ = (out["nanoattn"] != out["transformers"]).any(dim=0).nonzero()
        first_diff = None if differ.numel() == 0 else int(differ[0]) - prompt_len
        for impl, s in seconds.items():
            rows.append(dict(model=name, impl=impl + " greedy", batch=batch, cache=True, prompt=prompt_len,
                             new=new_tokens, tok_per_s=batch * new_tokens / s,
                             vs_transformers=seconds["transformers"] / s,
                             same_tokens=first_diff is None, first_diff=first_diff))
    return rows


@section("decode")
def decode_section(opts: BenchOptions, done: Mapping[str, list[Row]]) -> list[Row]:
    """Decoding tokens/s with and without the KV cache, MHA/GQA/MQA, and vs transformers' generate."""
    device = torch.device(opts.device)
    if opts.ckpt:
        model, name = load_checkpoint(opts.ckpt, device=device).model, str(opts.ckpt)
    else:
        torch.manual_seed(0)
        with device:
            model, name = GPT(opts.decode_model).eval(), f"{_shape(opts.decode_model)} (random)"
    cfg = model.cfg
    # The whole sequence fits max_seq_len, so every encoding (learned included) can decode it.
    total = min(cfg.max_seq_len, 64 if opts.quick else 256)
    prompt_len = total // 4
    new_tokens = total - prompt_len
    rows = []
    for batch in (1, 8):
        prompt = _random_tokens(cfg.vocab_size, (batch, prompt_len), device)
        for use_cache in (True, False):
            rate, cache_bytes = _sampled_rate(model, prompt, new_tokens, use_cache, opts)
            rows.append(dict(model=name, impl="nanoattn sampled", layout=_layout(cfg.n_head, cfg.n_kv_head),
                             batch=batch, cache=use_cache, prompt=prompt_len, new=new_tokens, tok_per_s=rate,
                             kv_cache_bytes=cache_bytes))
    # MHA vs GQA vs MQA at the same shape: every n_kv_head dividing n_head, random weights.
    prompt = _random_tokens(cfg.vocab_size, (8, prompt_len), device)
    for n_kv_head in sorted((d for d in range(1, cfg.n_head + 1) if cfg.n_head % d == 0), reverse=True):
        torch.manual_seed(0)
        with device:
            variant = GPT(dataclasses.replace(cfg, n_kv_head=n_kv_head)).eval()
        rate, cache_bytes = _sampled_rate(variant, prompt, new_tokens, True, opts)
        rows.append(dict(model=f"same shape (random), n_kv_head={n_kv_head}", impl="nanoattn sampled",
                         layout=_layout(cfg.n_head, n_kv_head), batch=8, cache=True, prompt=prompt_len,
                         new=new_tokens, tok_per_s=rate, kv_cache_bytes=cache_bytes))
    try:
        twin = _transformers_twin(model, device).eval()
    except ValueError as e:  # no transformers counterpart (nanoattn.hf says why), or no transformers
        return rows + [dict(model=name, impl=f"transformers comparison skipped: {e}")]
    return rows + _greedy_rows(model, twin, name, prompt_len, new_tokens, opts)


# ----------------------------------------------------------------------------- eval


@section("eval")
def eval_section(opts: BenchOptions, done: Mapping[str, list[Row]]) -> list[Row]:
    """Evaluation tokens/s and peak memory at 1x, 4x and 16x the training length, per encoding."""
    device = torch.device(opts.device)
    train_len = 64 if opts.quick else opts.seq_len
    lengths = [m * train_len for m in EVAL_MULTIPLES]
    stream = _random_tokens(opts.model.vocab_size, (lengths[-1] + 1,), device)  # [16 L + 1]
    # PeakMemory runs gc.collect() per length; frozen, the objects that exist now (transformers'
    # thousands after the train section) are not walked again, which took 0.3 s a call here.
    gc.freeze()
    try:
        return [row for pos in EVAL_POSITIONS for row in _eval_rows(pos, stream, lengths, opts)]
    finally:
        gc.unfreeze()


def _eval_rows(pos: str, stream: torch.Tensor, lengths: list[int], opts: BenchOptions) -> list[Row]:
    """Median tok/s and peak memory per length over the sweeps (one in quick mode, else ``reps``)."""
    from nanoattn.eval.length import evaluate_lengths

    train_len = lengths[0]
    torch.manual_seed(0)
    with stream.device:
        model = GPT(dataclasses.replace(opts.model, pos=pos, max_seq_len=train_len, rope_scaling=None)).eval()
    usable = lengths[:1] if pos == "learned" else lengths  # no positions past the learned table
    with torch.no_grad(), _autocast(stream.device, opts.dtype):  # warm-up: rope tables, allocator
        model.loss(stream[None, :train_len], stream[None, 1:train_len + 1])
    sweeps = [evaluate_lengths(model, stream, usable, batch_size=1, dtype=opts.dtype).results
              for _ in range(1 if opts.quick else opts.reps)]
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
    for row in rows:  # linear memory: 4x and 16x at about 4 and 16 (quadratic would be 16 and 256)
        row["memory_vs_1x"] = None if not first or row["peak_mib"] is None else row["peak_mib"] / first
    return rows


# ----------------------------------------------------------------------------- e2e


def read_run_rate(run: str | Path) -> tuple[RunConfig, float, int]:
    """(the run's config, median tok_per_s of its train records after the first, records used)."""
    run = Path(run)
    config_file, metrics_file = run / "config.yaml", run / "metrics.jsonl"
    for file in (config_file, metrics_file):
        if not file.is_file():
            raise ValueError(f"bench.run={str(run)!r} is invalid: no {file.name} (pass a run directory)")
    cfg = RunConfig.from_dict(yaml.safe_load(config_file.read_text()))
    rates = [record["tok_per_s"] for record in map(json.loads, metrics_file.read_text().splitlines())
             if "tok_per_s" in record]
    # The first window holds the warm-up (and any compilation); later ones are the steady state.
    if len(rates) < 2:
        raise ValueError(f"bench.run={str(run)!r}: {metrics_file} has {len(rates)} train record(s); "
                         "need at least 2 (the first is warm-up)")
    return cfg, statistics.median(rates[1:]), len(rates) - 1


def step_rate(cfg: RunConfig, device: torch.device, reps: int, seconds: float) -> tuple[float, str]:
    """(tokens/s of the training script's optimizer step for ``cfg`` without the script; autocast).

    Timed like the script's records: windows of ``train.log_interval`` steps, at least ``reps``
    of them and at least ``seconds`` in all, after a warm-up window; the median window's rate.
    """
    from nanoattn.train.loop import autocast_dtype
    from nanoattn.train.optim import make_optimizer

    t = cfg.train
    amp, reason = autocast_dtype(t.dtype, device)
    torch.manual_seed(t.seed)
    with device:
        model = GPT(cfg.model).train()
    optimizer = make_optimizer(model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                               decay_embeddings=t.decay_embeddings, device=device)
    loss_fn = torch.compile(model.loss) if t.compile else model.loss
    batches = [(_random_tokens(cfg.model.vocab_size, (t.batch_size, cfg.seq_len), device, seed=2 * m),
                _random_tokens(cfg.model.vocab_size, (t.batch_size, cfg.seq_len), device, seed=2 * m + 1))
               for m in range(t.grad_accum)]
    autocast = (torch.autocast(device.type, dtype=amp) if amp is not None else contextlib.nullcontext())

    def step() -> None:
        for x, y in batches:
            with autocast:
                loss = loss_fn(x, y)
            (loss / t.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip if t.grad_clip > 0 else math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def window() -> float:
        start = time.perf_counter()
        for _ in range(t.log_interval):
            step()
        _sync(device)
        return time.perf_counter() - start

    window()
    windows = [window()]
    while len(windows) < reps or sum(windows) < seconds:
        windows.append(window())
    return t.log_interval * t.batch_size * t.grad_accum * cfg.seq_len / statistics.median(windows), reason


@section("e2e")
def e2e_section(opts: BenchOptions, done: Mapping[str, list[Row]]) -> list[Row]:
    """The training script's tokens/s (from --run) vs the bare training step at the same shape."""
    if opts.run is None:
        return [dict(note="skipped: pass --run <run directory> (python scripts/train.py writes one)")]
    cfg, run_rate, windows = read_run_rate(opts.run)
    rate, reason = step_rate(cfg, torch.device(opts.device), opts.reps, opts.e2e_seconds)
    m, t = cfg.model, cfg.train
    return [dict(run=str(opts.run), shape=_shape(m, t.batch_size * t.grad_accum, cfg.seq_len), dtype=reason,
                 compile=t.compile, windows=windows, script_tok_per_s=run_rate, step_tok_per_s=rate,
                 script_vs_step=run_rate / rate)]


# ----------------------------------------------------------------------------- output


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
