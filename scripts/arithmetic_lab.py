"""The arithmetic lab: addition with the positions that make it generalize, over seeds, as a results page.

    python scripts/arithmetic_lab.py train=true                      # every row at seeds 0-2, scored at 1-4x
    python scripts/arithmetic_lab.py train=true digits=8 'rows=[nope,abacus_fire,coupling_ape]'
    python scripts/arithmetic_lab.py out=docs/results                # publish the page from existing runs
    python scripts/arithmetic_lab.py calibrate=control_budget train=true  # the control at growing budgets

Runs go to runs/arithmetic/<row>/seed<k>, the page to runs/arithmetic/arithmetic.{md,json,png} unless
``out`` names a folder. Every key: ``nanoattn.commands.labs.ArithmeticLabConfig``; mistakes end in one
``error:`` line.
"""

from _hydra_cli import lab_command

from nanoattn.commands.labs import ArithmeticLabConfig, arithmetic_lab

main = lab_command("arithmetic_lab", ArithmeticLabConfig, arithmetic_lab)

if __name__ == "__main__":
    main()
