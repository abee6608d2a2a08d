"""Sample text: ``python scripts/sample.py ckpt=<checkpoint or run dir> prompt="ROMEO:" [key=value]``.

Prints the prompt followed by each continuation, and a line with tokens/s and the KV cache's
size to stderr. All the work is ``nanoattn.commands.sample``; a user mistake ends in one
``error: ...`` line, not a traceback.
"""

from _hydra_cli import command

from nanoattn.commands.sample import SampleConfig, sample

main = command("sample", SampleConfig, sample)

if __name__ == "__main__":
    main()
