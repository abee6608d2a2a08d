"""Training: the loop, one optimizer step, optimizer and schedules, distributed helpers, context extension."""

from nanoattn.train.loop import TrainingDiverged, train

__all__ = ["TrainingDiverged", "train"]
