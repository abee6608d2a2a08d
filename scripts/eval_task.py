"""A task run's accuracy by size: ``python scripts/eval_task.py ckpt=<checkpoint or run dir> [key=value]``.

Composes ``configs/eval_task.yaml`` over ``nanoattn.commands.eval_task.TaskEvalConfig`` (every key
and its default) and runs ``eval_task``: exact-match and per-token accuracy at 1x-4x the training
length, the JSON report (every instance's seed) and its figure in the run directory, the table on
stdout. A user mistake ends in one ``error: ...`` line.
"""

from _hydra_cli import command

from nanoattn.commands.eval_task import TaskEvalConfig, eval_task

main = command("eval_task", TaskEvalConfig, eval_task)

if __name__ == "__main__":
    main()
