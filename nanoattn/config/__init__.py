"""Typed configuration: the one schema of models (``model.py``) and training runs (``run.py``).

Nothing here imports Hydra: the scripts register these dataclasses with Hydra's ConfigStore
(and ``PRESETS`` as the ``model`` group), the library only sees dataclasses.
"""

from nanoattn.config.model import MLPS, NORMS, ModelConfig
from nanoattn.config.presets import PRESETS, preset
from nanoattn.config.run import DataConfig, LoggerConfig, RunConfig, TaskConfig, TokenizerConfig, TrainConfig

__all__ = ["MLPS", "NORMS", "PRESETS", "DataConfig", "LoggerConfig", "ModelConfig", "RunConfig",
           "TaskConfig", "TokenizerConfig", "TrainConfig", "preset"]
