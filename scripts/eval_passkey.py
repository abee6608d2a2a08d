"""Passkey retrieval: ``python scripts/eval_passkey.py ckpt=<checkpoint or run dir> [key=value]``.

Composes ``configs/eval_passkey.yaml`` over ``nanoattn.commands.eval_passkey.PasskeyEvalConfig``
(every key and its default) and runs ``eval_passkey``: the JSON report and its heat map in the run
directory, accuracy per length and depth on stdout. A user mistake ends in one ``error: ...`` line.
"""

from _hydra_cli import command

from nanoattn.commands.eval_passkey import PasskeyEvalConfig, eval_passkey

main = command("eval_passkey", PasskeyEvalConfig, eval_passkey)

if __name__ == "__main__":
    main()
