"""Export a checkpoint to transformers: ``python scripts/export_hf.py ckpt=<dir> out=<new dir>``.

Writes config.json, model.safetensors and the tokenizer files in transformers' Llama format
(pos=rope) or GPT-2 format (pos=learned), loadable with ``AutoModelForCausalLM.from_pretrained``.
All the work is ``nanoattn.hf.export_checkpoint``; a user mistake (a model with no transformers
counterpart, a missing checkpoint, a misspelt key) ends in one ``error: ...`` line, not a traceback.
"""

import sys

import hydra
from _hydra_cli import guarded
from omegaconf import DictConfig, OmegaConf

from nanoattn.hf import export_checkpoint


@hydra.main(version_base="1.3", config_path="../configs", config_name="export_hf")
def main(cfg: DictConfig) -> None:
    try:
        out = export_checkpoint(**OmegaConf.to_container(cfg, resolve=True))
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"wrote {out} (load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}))")


if __name__ == "__main__":
    guarded(main)
