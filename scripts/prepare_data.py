"""Prepare a corpus for training: ``python scripts/prepare_data.py [data=<corpus>] [force=true]``.

Writes ``<data.root>/<data.name>/`` (train.bin, val.bin, tokenizer.json, meta.json) and prints its
statistics; does nothing when that folder is already up to date with the config. All the work is
``nanoattn.data.prepare_data``; a user mistake ends in one ``error: ...`` line, not a traceback.
"""

import sys

import hydra
from omegaconf import DictConfig, OmegaConf

from nanoattn.config import DataConfig
from nanoattn.data import prepare_data


@hydra.main(version_base="1.3", config_path="../configs", config_name="prepare_data")
def main(cfg: DictConfig) -> None:
    try:
        if not isinstance(cfg.force, bool):
            raise ValueError(f"force={cfg.force!r} is invalid: must be true or false")
        prepare_data(DataConfig.from_dict(OmegaConf.to_container(cfg.data, resolve=True)), force=cfg.force)
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
