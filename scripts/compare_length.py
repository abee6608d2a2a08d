"""Compare length evaluations: ``python scripts/compare_length.py RUN_OR_JSON [...] [--out f.png]``.

Each argument is a ``length_eval*.json`` file or a run directory (then its ``length_eval.json``).
Draws one figure with a curve per run and prints the markdown table (also written with
``--table``); all the work is ``nanoattn.eval.compare_length``. Mistakes end in one ``error:`` line.
"""

import argparse
import sys

from nanoattn.eval import compare_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="length_eval JSON files or run directories")
    parser.add_argument("--out", default="length_compare.png", help="the figure (default: %(default)s)")
    parser.add_argument("--table", default=None, help="also write the markdown table here")
    parser.add_argument("--labels", nargs="+", default=None, help="one label per run (default: run names)")
    args = parser.parse_args()
    try:
        table = compare_length(args.paths, labels=args.labels, out=args.out, table_out=args.table)
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(table, end="")
    print(f"wrote {args.out}" + (f" and {args.table}" if args.table else ""))


if __name__ == "__main__":
    main()
