"""The project's benchmarks: ``python scripts/bench.py [--only decode] [--quick] [--out bench.json]``.

Each section is a function registered in ``SECTIONS`` with ``@section(name)``: it takes the
parsed arguments and returns rows (flat dicts). Rows from every selected section are printed
as one table and, with ``--out``, written as JSON with the settings they were measured under.
Timings are medians over ``--reps`` repetitions after one warm-up run.

Sections:
- ``decode``: tokens/s of ``nanoattn.generate``'s decoding at batch 1 and 8, with and without the KV
  cache, for ``--ckpt`` or a randomly initialised ``llama-tiny``; then the KV cache's bytes
  (and cached tokens/s) for MHA, GQA and MQA at the same shape.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from nanoattn import GPT, load_checkpoint, preset
from nanoattn.generate import Decoding

Row = dict[str, Any]
SECTIONS: dict[str, Callable[[argparse.Namespace], list[Row]]] = {}


def section(name: str):
    def register(fn: Callable[[argparse.Namespace], list[Row]]):
        SECTIONS[name] = fn
        return fn
    return register


def median_seconds(fn: Callable[[], Any], reps: int, device: torch.device) -> float:
    """Median wall time of fn() over reps runs, after one warm-up run."""
    def timed() -> float:
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - start

    timed()
    return statistics.median(timed() for _ in range(reps))


# ----------------------------------------------------------------------------- decode


def _decode(model: GPT, batch: int, prompt_len: int, new_tokens: int, use_cache: bool,
            args: argparse.Namespace) -> tuple[float, int]:
    """(generated tokens per second, prefill included, sampling at temperature 1; KV-cache bytes)."""
    device = model.tok_emb.weight.device
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, prompt_len),
                           generator=torch.Generator().manual_seed(0)).to(device)
    cache_bytes = 0

    def run() -> None:
        nonlocal cache_bytes
        with torch.autocast(device.type, dtype=args.dtype, enabled=args.dtype != torch.float32):
            decoding = Decoding(model, prompt, new_tokens, use_cache=use_cache,
                                generator=torch.Generator(device=device).manual_seed(0))
            for _ in decoding:
                pass
        cache_bytes = decoding.kv_cache_bytes

    seconds = median_seconds(run, args.reps, device)
    return batch * new_tokens / seconds, cache_bytes


@section("decode")
def decode(args: argparse.Namespace) -> list[Row]:
    device = torch.device(args.device)
    if args.ckpt:
        model, name = load_checkpoint(args.ckpt, device=device).model, str(args.ckpt)
    else:
        torch.manual_seed(0)
        with device:
            model, name = GPT(preset("llama-tiny")).eval(), "llama-tiny (random)"
    cfg = model.cfg
    # The whole sequence fits max_seq_len, so every encoding (learned included) can decode it.
    total = min(cfg.max_seq_len, 64 if args.quick else 256)
    prompt_len = total // 4
    new_tokens = total - prompt_len
    rows = []
    for batch in (1, 8):
        for use_cache in (True, False):
            rate, cache_bytes = _decode(model, batch, prompt_len, new_tokens, use_cache, args)
            rows.append(dict(model=name, layout=_layout(cfg.n_head, cfg.n_kv_head), batch=batch,
                             cache=use_cache, prompt=prompt_len, new=new_tokens, tok_per_s=rate,
                             kv_cache_bytes=cache_bytes))
    # MHA vs GQA vs MQA at the same shape: every n_kv_head dividing n_head, random weights.
    for n_kv_head in sorted((d for d in range(1, cfg.n_head + 1) if cfg.n_head % d == 0), reverse=True):
        torch.manual_seed(0)
        with device:
            variant = GPT(dataclasses.replace(cfg, n_kv_head=n_kv_head)).eval()
        rate, cache_bytes = _decode(variant, 8, prompt_len, new_tokens, True, args)
        rows.append(dict(model=f"same shape (random), n_kv_head={n_kv_head}",
                         layout=_layout(cfg.n_head, n_kv_head), batch=8, cache=True, prompt=prompt_len,
                         new=new_tokens, tok_per_s=rate, kv_cache_bytes=cache_bytes))
    return rows


def _layout(n_head: int, n_kv_head: int) -> str:
    return "MHA" if n_kv_head == n_head else "MQA" if n_kv_head == 1 else f"GQA-{n_head // n_kv_head}"


# ----------------------------------------------------------------------------- output


def format_table(rows: list[Row]) -> str:
    columns = list(dict.fromkeys(key for row in rows for key in row))

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:,.1f}"
        if isinstance(value, int) and not isinstance(value, bool):
            return f"{value:,}"
        return "" if value is None else str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(SECTIONS),
                        help="run only this section (repeatable); default: all")
    parser.add_argument("--quick", action="store_true", help="short runs, for a smoke test")
    parser.add_argument("--out", type=Path, help="write the rows and settings as JSON here")
    parser.add_argument("--ckpt", help="a checkpoint or run directory (default: random llama-tiny)")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | mps (default: cpu)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="bfloat16 runs under autocast")
    parser.add_argument("--reps", type=int, help="timed repetitions per measurement (default: 5, quick: 3)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    args.reps = args.reps or (3 if args.quick else 5)
    if args.reps < 1:
        parser.error(f"--reps={args.reps} must be >= 1")
    args.dtype = getattr(torch, args.dtype)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {}
    try:
        for name in args.only or SECTIONS:
            results[name] = [{"section": name, **row} for row in SECTIONS[name](args)]
            print(format_table(results[name]), end="\n\n", flush=True)
    except ValueError as e:  # CheckpointError is a ValueError
        sys.exit(f"error: {e}")
    if args.out:
        settings = dict(argv=sys.argv[1:], quick=args.quick, reps=args.reps, device=args.device,
                        dtype=str(args.dtype), threads=torch.get_num_threads(), torch=torch.__version__,
                        python=platform.python_version(), machine=platform.processor() or platform.machine())
        args.out.write_text(json.dumps({"settings": settings, "sections": results}, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
