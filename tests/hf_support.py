"""Shared by the transformers interop tests (test_hf.py, test_hf_families.py): random models with
every weight moved off its initial value, so a mapping error cannot hide behind zeros or ones."""

from __future__ import annotations

import torch

from nanoattn import GPT, ModelConfig


def perturb_(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Add N(0, 0.1) to every parameter: norm weights become 1 +- 0.1, biases +- 0.1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)
    return module.eval()


def model(**fields) -> GPT:
    torch.manual_seed(0)
    return perturb_(GPT(ModelConfig(**fields)))
