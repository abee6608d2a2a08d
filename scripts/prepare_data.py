"""Prepare a corpus for training: ``python scripts/prepare_data.py [data=<corpus>] [force=true]``.

Writes ``<data.root>/<data.name>/`` (token shards, tokenizer.json, meta.json) and prints its
statistics; does nothing when that folder is already up to date with the config, and resumes an
interrupted preparation of the same config. All the work is
``nanoattn.commands.prepare_data``; a user mistake ends in one ``error: ...`` line, not a traceback.
"""

from _hydra_cli import command

from nanoattn.commands.prepare_data import PrepareDataConfig, prepare

main = command("prepare_data", PrepareDataConfig, prepare)

if __name__ == "__main__":
    main()
