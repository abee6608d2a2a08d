"""Extend a RoPE checkpoint's context by fine-tuning it at a longer length under a RoPE scaling.

    python scripts/extend_context.py train.init_from=<checkpoint or run dir> [train.seq_len=512]
        [model.rope_scaling.type=linear|ntk|yarn|llama3] [model.rope_scaling.factor=4] [out_dir=...]

Composes ``configs/extend_context.yaml`` (train.yaml's groups; its model node holds only what an
extension sets, the rest is the checkpoint's) and calls ``nanoattn.train.extend.extend_context``.
A user mistake ends in one ``error: ...`` line, not a traceback.
"""

import os
import sys

import hydra
from _hydra_cli import declared_defaults, guarded
from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from nanoattn.config import RunConfig
from nanoattn.train import TrainingDiverged
from nanoattn.train.extend import EXTENSION_FIELDS, extend_context

# RunConfig's keys, so a misspelt one fails at composition; model.d_model=... fails there too.
ConfigStore.instance().store(name="extend_context_schema",
                             node={**declared_defaults(RunConfig), "model": dict.fromkeys(EXTENSION_FIELDS)})


@hydra.main(version_base="1.3", config_path="../configs", config_name="extend_context")
def main(cfg: DictConfig) -> None:
    try:
        extend_context(OmegaConf.to_container(cfg, resolve=True))
    except (ValueError, TrainingDiverged) as e:  # CheckpointError and DataError are ValueErrors
        sys.exit(f"error: {e}" if os.environ.get("RANK", "0") == "0" else 1)


if __name__ == "__main__":
    guarded(main)
