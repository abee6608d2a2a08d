"""Train a model: ``python scripts/train.py [model=...] [pos=...] [experiment=...] [key=value ...]``.

Composes ``configs/train.yaml`` (``nanoattn.config.RunConfig`` as its schema, the presets of
``nanoattn.config.PRESETS`` as its ``model`` group) and calls ``nanoattn.train.train``; works
under ``torchrun`` (DDP) and ``-m`` (sweeps). The run directory is Hydra's output directory:
``out_dir`` for a run, ``<out_dir>/<job number>`` in a sweep. A user mistake ends in one
``error: ...`` line, not a traceback. Every key and rule: docs/training.md.

    python scripts/train.py                                   # the default run (README: its time)
    python scripts/train.py experiment=debug                  # a smoke run in seconds
    python scripts/train.py model=llama-tiny pos=alibi model.n_kv_head=2 train.max_steps=2000
    python scripts/train.py out_dir=runs/x train.resume=true  # continue a run exactly
    python scripts/train.py -m pos=rope,alibi                 # a sweep, one directory per job
"""

from _hydra_cli import training_command

from nanoattn.config import RunConfig
from nanoattn.train import TrainingDiverged, train
from nanoattn.validation import declared_defaults

main = training_command("train", declared_defaults(RunConfig), train, (TrainingDiverged,))

if __name__ == "__main__":
    main()
