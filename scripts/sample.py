"""Sample text: ``python scripts/sample.py ckpt=<checkpoint or run dir> prompt="ROMEO:" [key=value]``.

Composes ``configs/sample.yaml`` and calls ``nanoattn.generate.sample_from_checkpoint``, which
prints the prompt followed by each continuation, and a line with tokens/s and the KV cache's
size to stderr. A user mistake ends in one ``error: ...`` line.
"""

import sys

import hydra
from _hydra_cli import guarded
from omegaconf import DictConfig, OmegaConf

from nanoattn.generate import SampleConfig, sample_from_checkpoint


@hydra.main(version_base="1.3", config_path="../configs", config_name="sample")
def main(cfg: DictConfig) -> None:
    try:
        sample_from_checkpoint(SampleConfig.from_dict(OmegaConf.to_container(cfg, resolve=True)))
    except ValueError as e:  # CheckpointError is a ValueError
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    guarded(main)
