"""The length-generalization task suite (docs/tasks.md): a registry of seeded task generators.

Adding a task is one module plus one line here. Batches of a task are ``nanoattn.data.TaskData``;
its scoring by length is ``nanoattn.eval.tasks``.
"""

from nanoattn.tasks.addition import Addition
from nanoattn.tasks.base import EVAL_FACTORS, Instance, Segment, Task
from nanoattn.tasks.copy import Copy, Reverse
from nanoattn.tasks.counting import Counting
from nanoattn.tasks.flip_flop import FlipFlop
from nanoattn.tasks.mqar import MultiQueryRecall
from nanoattn.tasks.parity import Parity
from nanoattn.tasks.retrieval import MultiKeyNeedle, VariableTracking
from nanoattn.tasks.selective_copy import SelectiveCopy

TASKS: dict[str, type[Task]] = {task.name: task for task in (
    Copy, Reverse, Addition, Parity, SelectiveCopy, Counting, FlipFlop, MultiKeyNeedle, VariableTracking,
    MultiQueryRecall)}

__all__ = ["EVAL_FACTORS", "TASKS", "Instance", "Segment", "Task"]
