"""``scripts/export_hf.py``: export a checkpoint (or a run's latest) as a transformers folder.

``rope_scaling`` writes a zero-shot context extension into the export; ``load_checkpoint``
fills its ``original_max_seq_len`` with the length the checkpoint was trained at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nanoattn.checkpoint import load_checkpoint
from nanoattn.hf import export_hf
from nanoattn.runtime import check_output
from nanoattn.validation import fail

OWNER = "export_hf"


@dataclass
class ExportConfig:
    """``scripts/export_hf.py``'s options; every default is stated here once."""

    ckpt: str | None = None  # a checkpoint directory, or a run directory (its latest checkpoint)
    out: str | None = None  # a new (or empty) folder for config.json, model.safetensors, tokenizer files
    rope_scaling: dict[str, Any] | None = None  # zero-shot RoPE scaling, e.g. {type: yarn, factor: 4}

    def __post_init__(self) -> None:
        if not isinstance(self.ckpt, (str, Path)) or not str(self.ckpt):
            fail(OWNER, "ckpt", self.ckpt, "pass ckpt=<checkpoint or run directory>")
        if not isinstance(self.out, (str, Path)) or not str(self.out):
            fail(OWNER, "out", self.out, "pass out=<a new folder for the export>")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Mapping):
            fail(OWNER, "rope_scaling", self.rope_scaling, "must be a mapping, e.g. {type: yarn, factor: 4}")


def export(cfg: ExportConfig) -> Path:
    """Export ``cfg.ckpt`` to ``cfg.out`` (a new or empty folder, not inside a checkpoint), print
    where it went; the folder."""
    check_output(cfg.out, f"{OWNER}.out", what="an export", folder=True)
    loaded = load_checkpoint(cfg.ckpt, rope_scaling=cfg.rope_scaling)
    out = export_hf(loaded.model, cfg.out, loaded.tokenizer)
    print(f"wrote {out} (load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r}))")
    return out
