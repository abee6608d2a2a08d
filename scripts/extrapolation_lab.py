"""The extrapolation lab: evaluate the lab's runs and write docs/extrapolation.{png,md}.

    python scripts/train.py -m experiment=extrapolation pos=sinusoidal,learned,rope,alibi,nope
    python scripts/extrapolation_lab.py               # perplexity at 1-16x, plus RoPE zero-shot scalings
    python scripts/train.py -m experiment=passkey pos=sinusoidal,learned,rope,alibi,nope
    python scripts/extrapolation_lab.py passkey=true  # passkey retrieval -> docs/passkey.png

Every key: ``nanoattn.commands.labs.LabConfig`` (``runs_root``, ``out_dir``, ``max_tokens``,
``samples``, ``batch_size``, ``dtype``, ``device``); mistakes end in one ``error:`` line.
"""

from _hydra_cli import command

from nanoattn.commands.labs import LabConfig, extrapolation_lab

main = command("extrapolation_lab", LabConfig, extrapolation_lab)

if __name__ == "__main__":
    main()
