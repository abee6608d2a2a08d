"""Train a model: ``python scripts/train.py [model=...] [pos=...] [experiment=...] [key=value ...]``.

Composes ``configs/train.yaml``, validates it as a ``nanoattn.config.RunConfig`` and calls
``nanoattn.train.train``; works under ``torchrun`` (DDP) and ``-m`` (sweeps). The run directory
is Hydra's output directory: ``out_dir`` for a run, ``<out_dir>/<job number>`` in a sweep.
A user mistake ends in one ``error: ...`` line, not a traceback.
"""

import os
import sys
from pathlib import Path

import hydra
from _hydra_cli import register_schema, guarded
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nanoattn.config import RunConfig
from nanoattn.train import TrainingDiverged, train

register_schema("train_schema", RunConfig)


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> None:
    hydra_dir = Path(HydraConfig.get().runtime.output_dir)
    values = OmegaConf.to_container(cfg, resolve=True)
    values["out_dir"] = str(hydra_dir)
    try:
        train(values)
    except (ValueError, TrainingDiverged) as e:  # CheckpointError and DataError are ValueErrors
        sys.exit(f"error: {e}" if os.environ.get("RANK", "0") == "0" else 1)
    finally:
        # Hydra creates its output directory before we run; drop it if it stayed empty (a failed
        # start, a resume that continues another directory, or a torchrun rank whose ${now:} differed).
        try:
            hydra_dir.rmdir()
        except OSError:
            pass


if __name__ == "__main__":
    guarded(main)
