"""The transformers model that ``train`` and ``decode`` compare nanoattn with, built from nanoattn's weights.

The twin is nanoattn's own model exported with ``nanoattn.hf.export_hf`` (so the shapes cannot
drift apart) and loaded with transformers' SDPA attention in float32, the weights nanoattn keeps.
A model with no transformers counterpart, or no transformers installed, is a ``ValueError`` that
says why; the sections report it instead of a comparison.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from nanoattn.hf import export_hf
from nanoattn.model import GPT


def transformers_twin(model: GPT, device: torch.device) -> torch.nn.Module:
    """transformers' AutoModelForCausalLM with ``model``'s weights (exported with nanoattn.hf)."""
    try:  # here, not at the top: an optional dependency that takes seconds to import
        import transformers
    except ImportError:
        raise ValueError("transformers is not installed; the comparison needs it: "
                         "pip install -e '.[dev]'") from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        folder = export_hf(model, Path(tmp) / "hf")
        twin = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa",
                                                                 dtype=torch.float32)
    return twin.to(device)
