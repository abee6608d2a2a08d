"""Perplexity at several lengths: ``python scripts/eval_length.py ckpt=<checkpoint or run dir> [key=value]``.

Composes ``configs/eval_length.yaml`` over ``nanoattn.commands.eval_length.LengthEvalConfig`` (every
key and its default) and runs ``eval_length``: the JSON report and its plot in the run directory,
the table on stdout. A user mistake ends in one ``error: ...`` line.
"""

from _hydra_cli import command

from nanoattn.commands.eval_length import LengthEvalConfig, eval_length

main = command("eval_length", LengthEvalConfig, eval_length)

if __name__ == "__main__":
    main()
