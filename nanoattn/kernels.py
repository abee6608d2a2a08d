"""Kernels chosen by measurement on the machine at hand, where the fastest one depends on the CPU and
its BLAS rather than on the computation: ``fastest_kernel`` times the candidates the first time a
shape is met and remembers the choice. ``Linear`` uses it for decoding's few-row products, and
``bf16_matmuls_faster`` for attention in bf16 on a CPU (two bf16 matmuls or SDPA's flash kernel).

A product of a few rows by a weight, [M, in] @ [out, in]^T, is a matrix-vector product that some
BLAS libraries run on a single core; the same dot products as one batched product of the weight's
row blocks run on every core. Which is faster depends on the CPU, so it is measured, not assumed.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.runtime import cache_dir, cpu_name, exclusive_lock, note, write_atomic

KERNEL_CHOICES = "kernels.json"  # in cache_dir(): {machine: {"<what> <shape>": kernel name}}
_kernel_choices: dict[str, str] = {}  # this process's, by "<machine> <what> <shape>"


def constant_when_compiled(fn: Callable) -> Callable:
    """``fn`` marked as ``torch.compiler.assume_constant_result`` marks it (compiled code calls it
    while tracing and keeps the answer), by the attribute Dynamo reads, without importing Dynamo:
    that import is most of ``import nanoattn``'s time, and only a process that compiles needs it."""
    fn._dynamo_marked_constant = True
    return fn


@functools.cache
def _kernel_machine(threads: int) -> str:
    """What a kernel's speed depends on besides its shape: the CPU, torch's build and its threads."""
    capability = torch.backends.cpu.get_cpu_capability()
    return f"{cpu_name()} | {capability} | torch {torch.__version__} | {threads} threads"


def kernel_choices() -> dict[str, str]:
    """Every kernel choice this process has taken, by "<machine> <what> <shape>": what a checkpoint
    records, so that a resumed run computes with the same kernels whatever the cache says then."""
    return dict(_kernel_choices)


def take_kernel_choices(recorded: Mapping[str, str]) -> None:
    """Take ``recorded`` (``kernel_choices`` of an earlier process) before any kernel is asked for:
    they win over the cache file, which another run may have changed or deleted since."""
    _kernel_choices.update({key: name for key, name in recorded.items()
                            if isinstance(key, str) and isinstance(name, str)})


def _read_choices(path: Path, say: bool = True) -> dict[str, dict[str, Any]]:
    """The cache file's choices by machine; nothing (and with ``say`` one line) for a file that is not
    that shape."""
    try:
        known = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        problem = f"are unreadable ({e})"
    else:
        if isinstance(known, dict) and all(isinstance(v, dict) for v in known.values()):
            return known
        problem = "are not a mapping of machines to choices"
    if say:
        note(f"kernel choices {path} {problem}: measured again and rewritten")
    return {}


def fastest_kernel(what: str, shape: str, kernels: dict[str, Callable[[], object]], repeats: int = 5) -> str:
    """The name of the fastest of ``kernels`` (calls that compute the same thing) on this machine.

    The first time ``what`` is asked for at ``shape``, the kernels are timed alternately, ``repeats``
    times each, and the fastest single time wins; the choice is then remembered in this process and in
    ``cache_dir()/KERNEL_CHOICES`` under the machine's CPU, torch and thread count, so that later runs
    on the machine take the same kernels, and round alike, without timing them again. The file is
    read, merged and replaced under the cache's lock, so processes side by side keep each other's
    choices; an entry that names no candidate is measured again, with one line saying so.
    """
    machine = _kernel_machine(torch.get_num_threads())
    key = f"{what} {shape}"
    if (found := _kernel_choices.get(f"{machine} {key}")) is not None:
        return found
    path = cache_dir() / KERNEL_CHOICES
    choice = _read_choices(path).get(machine, {}).get(key)
    if choice is not None and (not isinstance(choice, str) or choice not in kernels):
        note(f"kernel choices {path}: {key!r} is {choice!r}, not one of {' | '.join(kernels)}: "
             "measured again")
        choice = None
    if choice is None:
        best = dict.fromkeys(kernels, float("inf"))
        for _ in range(repeats):  # alternated, so a change in the machine's load meets every kernel
            for name, run in kernels.items():
                start = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - start)
        choice = min(best, key=best.__getitem__)
        with contextlib.suppress(OSError):  # a read-only cache costs a measurement per process
            with exclusive_lock(path.parent, f"the kernel cache {path.parent}", wait=True):
                known = _read_choices(path, say=False)  # said above, if at all
                known.setdefault(machine, {})[key] = choice
                write_atomic(path, json.dumps(known, indent=1, sort_keys=True) + "\n")
    _kernel_choices[f"{machine} {key}"] = choice
    return choice


def grouped_scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q [B, H, Tq, D] . k [B, Hkv, Tk, D] / sqrt(D) -> [B, H, Tq, Tk]: each K/V head's query heads
    stacked as the rows of one matmul, so K/V are never repeated; the queries are scaled before it,
    a pass over [B, H, Tq, D], not over the scores."""
    B, H, Tq, D = q.shape
    Hkv, Tk = k.shape[1], k.shape[2]
    return ((q / math.sqrt(D)).reshape(B, Hkv, -1, D) @ k.transpose(-2, -1)).view(B, H, Tq, Tk)


def grouped_values(weights: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """weights [B, H, Tq, Tk] @ v [B, Hkv, Tk, Dv] -> [B, H, Tq, Dv], grouped as ``grouped_scores``
    (weights in any layout: a mechanism may hand them over mixed across heads)."""
    B, H, Tq, Tk = weights.shape
    return (weights.reshape(B, v.shape[1], -1, Tk) @ v).view(B, H, Tq, v.shape[-1])


# Causal attention as bf16 matmuls takes its queries in blocks of this many, each scored against only
# the keys up to its last query, so most of the masked triangle is never computed: smaller blocks
# skip more of it but make smaller products.
CAUSAL_QUERY_BLOCK = 64


def causal_query_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        attend: Callable[..., torch.Tensor]) -> torch.Tensor:
    """Causal attention of q [B, H, T, D] over the keys and values at the same T positions, k [B, Hkv,
    T, D] and v [B, Hkv, T, Dv], ``CAUSAL_QUERY_BLOCK`` queries at a time: ``attend(q_block, k_seen,
    v_seen, mask)`` -> [B, H, block, Dv] attends a block over the keys up to its last query, mask
    [block, keys] in q's dtype (-inf on the keys after each query, else 0). -> [B, H, T, Dv]."""
    T, outputs = q.shape[2], []
    for start in range(0, T, CAUSAL_QUERY_BLOCK):
        stop = min(start + CAUSAL_QUERY_BLOCK, T)
        mask = torch.full((stop - start, stop), float("-inf"), dtype=q.dtype, device=q.device).triu(start + 1)
        outputs.append(attend(q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], mask))
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=2)


# Fewest tokens ``bf16_matmuls_faster`` times attention at: shorter inputs take that choice.
BF16_TIMED_MIN_TOKENS = 64


@constant_when_compiled
def bf16_matmuls_faster(batch: int, heads: int, kv_heads: int, head_dim: int, keys: int,
                        backward: bool) -> bool:
    """Whether causal bf16 attention over ``keys`` keys runs faster here as two matmuls and a softmax
    (``grouped_scores``, ``grouped_values``) in causal query blocks than as SDPA's flash kernel:
    ``bf16_attention_timing`` at the keys rounded up to a power of two, at least
    ``BF16_TIMED_MIN_TOKENS``."""
    tokens = max(BF16_TIMED_MIN_TOKENS, 1 << (keys - 1).bit_length())
    return bf16_attention_timing(batch, heads, kv_heads, head_dim, tokens, backward)


@functools.cache  # within a process the first answer for a shape stands
def bf16_attention_timing(batch: int, heads: int, kv_heads: int, head_dim: int, tokens: int,
                          backward: bool) -> bool:
    """``bf16_matmuls_faster`` at ``tokens`` tokens, by ``fastest_kernel``: random q [batch, heads,
    tokens, head_dim] over k, v [batch, kv_heads, tokens, head_dim] (from a generator of their own:
    the global one is the run's), through the backward pass when ``backward``."""
    draws = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, n, tokens, head_dim, generator=draws, dtype=torch.bfloat16,
                           requires_grad=backward) for n in (heads, kv_heads, kv_heads))

    def timed(attend: Callable[[], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            y = attend()
            if backward:
                y.backward(torch.ones_like(y))
        return run

    def matmuls() -> torch.Tensor:
        return causal_query_blocks(q, k, v, lambda q, k, v, mask: grouped_values(
            torch.softmax(grouped_scores(q, k) + mask, dim=-1), v))

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=kv_heads != heads)

    shape = f"q {list(q.shape)} k {list(k.shape)} {'forward and backward' if backward else 'forward'}"
    kernels = {"bf16 matmuls": timed(matmuls), "sdpa": timed(sdpa)}
    with torch.enable_grad() if backward else contextlib.nullcontext():
        return fastest_kernel("causal attention bf16 in query blocks", shape, kernels) == "bf16 matmuls"


# Rows up to which a product without autograd picks its kernel by measurement: decoding's, one per
# sequence. Larger products (training, prefill, evaluation) are matrix products BLAS runs well.
MEASURED_ROWS = 64


def row_block_linear(x: torch.Tensor, weight: torch.Tensor, blocks: int) -> torch.Tensor:
    """x [M, in] @ weight [out, in]^T -> [M, out], as one batched product of x by the weight's
    ``blocks`` row blocks [out / blocks, in], transposed as views (``blocks`` divides out). A BLAS
    may run the plain product of a few rows on one core; it parallelises a batch over its blocks."""
    rows, (out, width) = x.shape[0], weight.shape
    y = torch.bmm(x.expand(blocks, rows, width), weight.view(blocks, out // blocks, width).transpose(1, 2))
    return y.transpose(0, 1).reshape(rows, out)  # [blocks, M, out / blocks] -> [M, out]


@constant_when_compiled
def intra_op_threads() -> int:
    """torch's thread count; a compiled graph takes the count it was traced at as a constant."""
    return torch.get_num_threads()


class Linear(nn.Linear):
    """nn.Linear whose products of at most ``MEASURED_ROWS`` rows on a CPU without autograd (a
    decoding step's) take the faster of F.linear and ``row_block_linear`` here, timed the first time
    a shape is met (``fastest_kernel``). Both compute the same dot products and differ by rounding
    only. Compiled code takes the choice measured eagerly before (timing cannot run while tracing),
    else F.linear."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # (rows, dtype, device, autocast, threads) -> row blocks; 0: F.linear
        self.row_blocks: dict[tuple, int] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[:-1].numel()
        if torch.is_grad_enabled() or rows > MEASURED_ROWS:
            return F.linear(x, self.weight, self.bias)
        key = (rows, x.dtype, x.device, torch.is_autocast_enabled("cpu"), intra_op_threads())
        blocks = self.row_blocks.get(key)
        if blocks is None:
            if torch.compiler.is_compiling():
                return F.linear(x, self.weight, self.bias)
            blocks = self.row_blocks[key] = self._measure(x.reshape(rows, -1))
        if not blocks:
            return F.linear(x, self.weight, self.bias)
        y = row_block_linear(x.reshape(rows, -1), self.weight, blocks)
        y = y if self.bias is None else y + self.bias.to(y.dtype)
        return y.view(*x.shape[:-1], -1)

    def _measure(self, x: torch.Tensor) -> int:
        """The row blocks for x [rows, in] here, one per thread where they divide the rows of the
        weight (0: F.linear is faster), by ``fastest_kernel``."""
        if x.device.type != "cpu":
            return 0
        out, width = self.weight.shape
        blocks = math.gcd(out, torch.get_num_threads())
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        kernels = {"linear": lambda: F.linear(x, self.weight),
                   "row blocks": lambda: row_block_linear(x, self.weight, blocks)}
        shape = f"[{x.shape[0]}, {width}] x [{out}, {width}]^T {str(dtype).removeprefix('torch.')}"
        return blocks if fastest_kernel("few-row linear", shape, kernels) == "row blocks" else 0
