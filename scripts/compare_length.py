"""Compare length evaluations: ``python scripts/compare_length.py 'paths=[runs/a,runs/b]' [out=f.png]``.

Each path is a ``length_eval*.json`` file or a run directory (then its ``length_eval.json``).
Draws one figure with a curve per run and prints the markdown table (also written with
``table=<file>``; ``labels=[...]`` names the runs). Every key:
``nanoattn.commands.compare_length.CompareLengthConfig``; mistakes end in one ``error:`` line.
"""

from _hydra_cli import command

from nanoattn.commands.compare_length import CompareLengthConfig, compare_length

main = command("compare_length", CompareLengthConfig, compare_length)

if __name__ == "__main__":
    main()
