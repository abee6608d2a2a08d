"""The extrapolation lab (or with passkey=true the passkey lab), over seeds, as a results page.

    python scripts/extrapolation_lab.py train=true                  # train every encoding at seeds 0-2,
                                                                    # perplexity at 1-16x, RoPE scalings
    python scripts/extrapolation_lab.py out=docs/results            # publish the page from existing runs
    python scripts/extrapolation_lab.py passkey=true train=true     # passkey fine-tunes of those runs

Runs go to runs/extrapolation/<pos>/seed<k> (runs/passkey/... with passkey=true), the page to
runs/<lab>/<lab>.{md,json,png} unless ``out`` names a folder. Every key:
``nanoattn.commands.labs.LabConfig``; mistakes end in one ``error:`` line.
"""

from _hydra_cli import lab_command

from nanoattn.commands.labs import LabConfig, extrapolation_lab

main = lab_command("extrapolation_lab", LabConfig, extrapolation_lab)

if __name__ == "__main__":
    main()
