"""The task lab: a run per (task, encoding) and seed, scored by size, as a results page.

    python scripts/task_lab.py train=true                                  # the default set at seeds 0-2
    python scripts/task_lab.py train=true encodings=[rope,my_pos] tasks=[copy,counting]   # a new encoding
    python scripts/task_lab.py out=docs/results                            # publish from existing runs

Runs go to runs/tasks/<task>/<pos>/seed<k>, the page to runs/tasks/tasks.{md,json,png} unless
``out`` names a folder. Every key: ``nanoattn.commands.labs.TaskLabConfig``; mistakes end in one
``error:`` line.
"""

from _hydra_cli import lab_command

from nanoattn.commands.labs import TaskLabConfig, task_lab

main = lab_command("task_lab", TaskLabConfig, task_lab)

if __name__ == "__main__":
    main()
