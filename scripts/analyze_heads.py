"""Analyse a checkpoint's attention heads: ``python scripts/analyze_heads.py ckpt=<dir> [out_dir=...]``.

Writes heads.json (per-head statistics, kind, importance; the pruning curve), attention_maps.png,
importance.png, pruning.png and, with ``head=[layer,head]``, that head's map at full size. Every
key: ``nanoattn.commands.analyze_heads.HeadAnalysisConfig``; a user mistake (a missing checkpoint
or data folder, a head out of range, a misspelt key) ends in one ``error: ...`` line.
"""

from _hydra_cli import command

from nanoattn.commands.analyze_heads import HeadAnalysisConfig, analyze_heads

main = command("analyze_heads", HeadAnalysisConfig, analyze_heads)

if __name__ == "__main__":
    main()
