"""Analyse a checkpoint's attention heads: ``python scripts/analyze_heads.py ckpt=<dir> [out_dir=...]``.

Writes heads.json (per-head statistics, kind, importance; the pruning curve), attention_maps.png,
importance.png, pruning.png and, with ``head=[layer,head]``, that head's map at full size. All the
work is ``nanoattn.eval.heads.analyze_heads``; a user mistake (a missing checkpoint or data folder,
a head out of range, a misspelt key) ends in one ``error: ...`` line, not a traceback.
"""

import sys

import hydra
from _hydra_cli import guarded
from omegaconf import DictConfig, OmegaConf

from nanoattn.eval.heads import HeadAnalysisConfig, analyze_heads


@hydra.main(version_base="1.3", config_path="../configs", config_name="analyze_heads")
def main(cfg: DictConfig) -> None:
    try:
        analyze_heads(HeadAnalysisConfig.from_dict(OmegaConf.to_container(cfg, resolve=True)))
    except ValueError as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    guarded(main)
