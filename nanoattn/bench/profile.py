"""``profile``: where one training step's time goes, by kind of work.

- The step is the ``train_recipe``'s run (``speedrun.recipe``; by default the default run's: model,
  batch, dtype and optimizer as ``python scripts/train.py`` runs them), one update by the loop's
  ``optimizer_step`` on random tokens, ``reps`` of them under ``torch.profiler`` after two
  untimed ones; eager, and compiled too with ``compile=true``.
- Every profiled op's self time (CPU, or CUDA on a GPU) goes to one kind by its name (``KINDS``,
  first match wins): matmuls, attention (the SDPA kernels; with ``model.attn_kernel=auto`` on CPU
  in bf16 attention is two matmuls and a softmax, counted under those), softmax and loss, norms, the
  optimizer (its fused and foreach kernels, Muon's orthogonalisation included in its matmuls is
  counted as matmul), casts and copies, fills, elementwise arithmetic (activations, RoPE's
  multiplies, residual adds), a compiled step's fused kernels, and the rest. The rows are
  milliseconds per step and shares of the profiled total, the largest first; the profiler's own
  overhead inflates small ops a little, so the shares rank the costs rather than time them.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping

import torch
from torch.profiler import ProfilerActivity, profile

from nanoattn.bench.core import BenchConfig, Row, random_tokens, section, shape_text
from nanoattn.bench.speedrun import recipe
from nanoattn.config import RunConfig
from nanoattn.model import GPT
from nanoattn.runtime import autocast, autocast_dtype, compile_choice, synchronize
from nanoattn.train.optim import optimizer_for
from nanoattn.train.step import optimizer_step, wrap_for_training

# (kind, substrings of an op name); the first kind with a matching substring takes the op.
KINDS = (
    # Inductor's generated kernels: what compilation fused (elementwise work, norms, the loss).
    ("fused (compiled)", ("CompiledFxGraph",)),
    ("attention", ("scaled_dot_product", "_flash_attention", "_efficient_attention")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")),
    ("softmax and loss", ("softmax", "nll_loss", "cross_entropy", "logsumexp")),
    ("norms", ("rms_norm", "layer_norm", "linalg_vector_norm", "aten::norm")),
    ("optimizer", ("adamw", "_foreach", "Optimizer.", "muon")),
    ("casts and copies", ("aten::to", "_to_copy", "aten::copy_", "aten::clone", "aten::contiguous")),
    ("fills", ("aten::fill_", "aten::zero_", "aten::zeros", "aten::ones", "aten::full")),
    ("elementwise", ("aten::mul", "aten::add", "aten::sub", "aten::div", "aten::neg", "aten::cat", "silu",
                     "gelu", "relu", "aten::pow", "aten::square", "aten::rsqrt", "aten::where", "aten::sum")),
)


def kind_of(op: str) -> str:
    """The kind an op's time counts under (``KINDS``), ``other`` when none matches."""
    for kind, names in KINDS:
        if any(name in op for name in names):
            return kind
    return "other"


@section("profile")
def profile_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """The recipe's training step under torch.profiler, its self time grouped by kind of work: eager,
    and with ``compile=true`` compiled too, so each kind's share says what compilation removed."""
    run = recipe(cfg.train_recipe)
    device = cfg.torch_device()
    steps = [False, True] if compile_choice(cfg.compile, device, "bench.compile")[0] else [False]
    return [row for compiled in steps for row in _profile(run, compiled, cfg.reps, device)]


@contextlib.contextmanager
def native_stderr_dropped() -> Iterator[None]:
    """The process's stderr (fd 2) to /dev/null: the profiler's C++ side prints a line there at each
    start and stop, past Python's ``sys.stderr``. Only those two calls are wrapped, so the step's own
    warnings still show."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profile(run: RunConfig, compiled: bool, reps: int, device: torch.device) -> list[Row]:
    t = run.train
    amp, reason = autocast_dtype(t.dtype, device)
    torch.manual_seed(0)
    with device:
        model = GPT(run.model).train()
    optimizer = optimizer_for(model, t, device)
    net = wrap_for_training(model, ddp=False, compile=compiled, device=device)
    shape = (t.batch_size, run.seq_len)
    batch = (random_tokens(run.model.vocab_size, shape, device, seed=1),
             random_tokens(run.model.vocab_size, shape, device, seed=2))

    def step() -> None:
        optimizer_step(net, model, optimizer, [batch], grad_clip=t.grad_clip,
                       autocast=lambda: autocast(device, amp))

    for _ in range(2):  # a compiled step compiles in the first
        step()
    synchronize(device)
    activities = [ProfilerActivity.CUDA] if device.type == "cuda" else [ProfilerActivity.CPU]
    prof = profile(activities=activities)
    with native_stderr_dropped():
        prof.start()
    for _ in range(reps):
        step()
    synchronize(device)
    with native_stderr_dropped():
        prof.stop()
    times: dict[str, float] = {}
    for event in prof.key_averages():
        self_time = event.self_device_time_total if device.type == "cuda" else event.self_cpu_time_total
        times[kind_of(event.key)] = times.get(kind_of(event.key), 0.0) + self_time
    total = sum(times.values())
    head = dict(shape=shape_text(run.model, t.batch_size, run.seq_len), dtype=reason, optimizer=t.optimizer,
                step="compiled" if compiled else "eager")
    return [dict(**head, kind=kind, ms_per_step=us / 1000 / reps, share=us / total)
            for kind, us in sorted(times.items(), key=lambda item: -item[1])]
