"""The extrapolation lab: train the lab's runs, evaluate them, write docs/extrapolation.{png,md}.

    python scripts/extrapolation_lab.py train=true    # trains every encoding (2 at a time), then
                                                      # perplexity at 1-16x, plus RoPE zero-shot scalings
    python scripts/extrapolation_lab.py               # evaluate runs already in runs/extrapolation
    python scripts/extrapolation_lab.py passkey=true train=true  # passkey fine-tunes -> docs/passkey.png

Every key: ``nanoattn.commands.labs.LabConfig`` (``train``, ``workers``, ``train_overrides``,
``runs_root``, ``out_dir``, ``max_tokens``, ``samples``, ``batch_size``, ``dtype``, ``device``);
mistakes end in one ``error:`` line.
"""

from _hydra_cli import command

from nanoattn.commands.labs import LabConfig, extrapolation_lab

main = command("extrapolation_lab", LabConfig, extrapolation_lab)

if __name__ == "__main__":
    main()
