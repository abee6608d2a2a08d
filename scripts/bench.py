"""The project's benchmarks: ``python scripts/bench.py [--only train] [--quick] [--out bench.json]``.

Sections (each a function in ``nanoattn/bench.py``, which states the measuring rules):
- ``train``: training-step tokens/s of nanoattn vs transformers' Llama of the same shape, float32
  and bfloat16 autocast, alternating runs (``--compile`` adds torch.compile'd steps of both);
- ``mfu``: those rates as model FLOPs utilisation of the measured 2048^3 matmul peak;
- ``decode``: tokens/s with and without the KV cache, MHA/GQA/MQA, and greedy decoding vs
  transformers' ``generate`` on the same weights, with a check that the tokens are identical;
- ``eval``: evaluation tokens/s and peak memory at 1x, 4x and 16x the training length per encoding;
- ``e2e``: the training script's tokens/s read from ``--run``'s metrics.jsonl vs the bare step.
Rows from every section are printed as tables and, with ``--out``, written as JSON with the
settings they were measured under (thread count and load average included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import torch

from nanoattn import preset
from nanoattn.bench import SECTIONS, BenchOptions, format_table, machine_name, run_sections


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=list(SECTIONS),
                        help="run only this section (repeatable); default: all, in the order above")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, shorter sequences (< 2 min)")
    parser.add_argument("--out", type=Path, help="write the rows and settings as JSON here")
    parser.add_argument("--model", default="llama-small", help="train/mfu/eval preset (default: llama-small)")
    parser.add_argument("--batch-size", type=int, default=8, help="train/mfu batch (default: 8)")
    parser.add_argument("--seq-len", type=int, default=256, help="train/mfu length; eval's 1x")
    parser.add_argument("--compile", action="store_true", help="train: also time torch.compile'd steps")
    parser.add_argument("--ckpt", help="decode: a checkpoint or run directory (default: random llama-tiny)")
    parser.add_argument("--run", help="e2e: a run directory written by scripts/train.py")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | mps (default: cpu)")
    parser.add_argument("--dtype", default="float32", help="decode/eval: float32 | bfloat16 (autocast)")
    parser.add_argument("--reps", type=int, help="timed repetitions per measurement (default: 5, quick: 3)")
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    loads = {"start": os.getloadavg()}  # 1, 5, 15-minute load averages: how shared the machine was

    def report(name: str, rows: list) -> None:
        loads[name] = os.getloadavg()
        print(format_table(rows), f"load average {loads[name][0]:.2f}, {torch.get_num_threads()} threads",
              sep="\n", end="\n\n", flush=True)

    try:
        opts = BenchOptions(quick=args.quick, reps=args.reps or (3 if args.quick else 5), device=args.device,
                            dtype=args.dtype, model=preset(args.model, max_seq_len=args.seq_len),
                            batch_size=args.batch_size, seq_len=args.seq_len, compile=args.compile,
                            ckpt=args.ckpt, run=args.run, e2e_seconds=10.0 if args.quick else 30.0)
        results = run_sections(args.only or SECTIONS, opts, on_done=report)
    except ValueError as e:  # CheckpointError is a ValueError
        sys.exit(f"error: {e}")
    if args.out:
        settings = dict(argv=sys.argv[1:], quick=opts.quick, reps=opts.reps, device=opts.device,
                        dtype=opts.dtype, threads=torch.get_num_threads(), load_average=loads,
                        torch=torch.__version__, python=platform.python_version(), cpu=machine_name())
        args.out.write_text(json.dumps({"settings": settings, "sections": results}, indent=2) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
