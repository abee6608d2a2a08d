from nanoattn.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    load_checkpoint,
    load_trainer_state,
    resolve_checkpoint,
    save_checkpoint,
)

__all__ = ["Checkpoint", "CheckpointError", "load_checkpoint", "load_trainer_state", "resolve_checkpoint",
           "save_checkpoint"]
