"""The task lab: train a run per (task, encoding), score each by size, write docs/tasks.{png,md,json}.

    python scripts/task_lab.py train=true                       # the default set (docs/tasks.md), then
                                                                # exact match at 1-4x the training size
    python scripts/task_lab.py train=true encodings=[rope,my_pos] tasks=[copy,counting]   # a new encoding
    python scripts/task_lab.py                                  # score runs already in runs/tasks

Every key: ``nanoattn.commands.labs.TaskLabConfig`` (``tasks``, ``encodings``, ``factors``,
``per_bin``, ``seed``, ``train``, ``workers``, ``train_overrides``, ``runs_root``, ``out_dir``,
``batch_size``, ``dtype``, ``device``); mistakes end in one ``error:`` line.
"""

from _hydra_cli import command

from nanoattn.commands.labs import TaskLabConfig, task_lab

main = command("task_lab", TaskLabConfig, task_lab)

if __name__ == "__main__":
    main()
