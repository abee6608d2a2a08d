"""The extrapolation lab: evaluate the lab's runs and write docs/extrapolation.{png,md}.

    python scripts/train.py -m experiment=extrapolation pos=sinusoidal,learned,rope,alibi,nope
    python scripts/extrapolation_lab.py            # perplexity at 1-16x, plus RoPE zero-shot scalings
    python scripts/train.py -m experiment=passkey pos=sinusoidal,learned,rope,alibi,nope
    python scripts/extrapolation_lab.py --passkey  # passkey retrieval -> docs/passkey.png

All the work is ``nanoattn.eval.extrapolation_lab`` / ``nanoattn.eval.passkey.passkey_lab``;
mistakes end in one ``error:`` line.
"""

import argparse
import sys
import time

from nanoattn.eval import extrapolation_lab
from nanoattn.eval.passkey import passkey_lab


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passkey", action="store_true", help="evaluate runs/passkey/<pos> instead")
    parser.add_argument("--runs-root", default=None,
                        help="where the runs are (default: runs/extrapolation, or runs/passkey)")
    parser.add_argument("--out-dir", default="docs", help="figure and table (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=32768, help="targets per length")
    parser.add_argument("--samples", type=int, default=20, help="passkey keys per cell")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    began = time.perf_counter()
    common = dict(out_dir=args.out_dir, batch_size=args.batch_size, dtype=args.dtype, device=args.device)
    try:
        if args.passkey:
            table = passkey_lab(args.runs_root or "runs/passkey", samples=args.samples, **common)
        else:
            table = extrapolation_lab(args.runs_root or "runs/extrapolation", max_tokens=args.max_tokens,
                                      **common)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(table, end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {args.out_dir}/extrapolation.md and "
          f"{args.out_dir}/{'passkey' if args.passkey else 'extrapolation'}.png")


if __name__ == "__main__":
    main()
