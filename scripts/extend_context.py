"""Extend a RoPE checkpoint's context by fine-tuning it at a longer length under a RoPE scaling.

    python scripts/extend_context.py ckpt=<checkpoint or run dir> [train.seq_len=512]
        [model.rope_scaling.type=linear|ntk|yarn|llama3] [model.rope_scaling.factor=4] [out_dir=...]

Composes ``configs/extend_context.yaml`` (train.yaml's groups; its model node holds only what an
extension sets, the rest is the checkpoint's) and calls ``nanoattn.train.extend.extend_context``.
A user mistake ends in one ``error: ...`` line, not a traceback.
"""

from _hydra_cli import training_command

from nanoattn.config import RunConfig
from nanoattn.train import TrainingDiverged
from nanoattn.train.extend import EXTENSION_FIELDS, extend_context
from nanoattn.validation import declared_defaults

main = training_command("extend_context",
                        {**declared_defaults(RunConfig), "ckpt": None,
                         "model": dict.fromkeys(EXTENSION_FIELDS)},
                        extend_context, (TrainingDiverged,))

if __name__ == "__main__":
    main()
