"""Training: the loop, optimizer and schedules, checkpoints, distributed helpers and plots.

``train`` and ``TrainingDiverged`` load on first use, so that ``import nanoattn`` (which needs
only the checkpoint reader) does not import the data layer and its ``datasets`` dependency.
"""

from nanoattn.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    load_trainer_state,
    resolve_checkpoint,
    save_checkpoint,
)

_LAZY = ("train", "TrainingDiverged")


def __getattr__(name: str):
    if name in _LAZY:
        from nanoattn.train import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'nanoattn.train' has no attribute {name!r}")


__all__ = ["Checkpoint", "CheckpointError", "TrainingDiverged", "load_checkpoint", "load_trainer_state",
           "resolve_checkpoint", "save_checkpoint", "train"]
