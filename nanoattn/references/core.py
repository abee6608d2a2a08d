"""What every reference check is made of: a check, a row, the difference measured, shared helpers."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from nanoattn.hf import export_hf
from nanoattn.references.fixtures import load_transformers, model, tokens


@dataclass(frozen=True)
class Check:
    reference: str  # the package and symbol, or the paper's equations written out here
    compared: str  # which of nanoattn's outputs, on what
    measure: Callable[[], float]  # the largest difference (``difference``)
    tolerance: float  # the largest difference allowed (the suite asserts it); its reason is beside its value
    note: str = ""  # a convention where nanoattn and the reference differ, and how the check bridges it


@dataclass(frozen=True)
class Row:
    kind: str  # "encoding" or "attention variant"
    paper: str  # authors, year, arXiv id
    checks: tuple[Check, ...]


def difference(ours: torch.Tensor, reference: torch.Tensor) -> float:
    """max |ours - reference| / max(1, |reference|), in float64."""
    ours, reference = ours.detach().double(), reference.detach().double()
    assert ours.shape == reference.shape, (ours.shape, reference.shape)
    return ((ours - reference).abs() / reference.abs().clamp(min=1)).max().item()


def visible(q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
    """[Tq, Tk]: True where the key is at or before its query."""
    return k_positions[None, :] <= q_positions[:, None]


def interleaved(dim: int) -> list[int]:
    """Dims reordered from the half-split rotary layout (pairs i, i + dim/2) to the interleaved one
    (pairs 2i, 2i + 1): ``x[..., interleaved(dim)]``. The same rotation, the dims permuted."""
    return [i // 2 + (dim // 2 if i % 2 else 0) for i in range(dim)]


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def acts(changed: torch.Tensor, unchanged: torch.Tensor, what: str) -> None:
    """Refuse a vacuous check: the reference must compute something else without ``what``."""
    if (changed - unchanged).abs().max() < 1e-3:
        raise AssertionError(f"{what} does not change the reference's output: the check compares nothing")


# ----------------------------------------------------------------------------- models via export


def exported(fields: dict, expected: type, **load) -> float:
    """A model with every weight perturbed, exported, loaded in transformers (eager attention): the
    logits of both on 80 tokens (2.5x the RoPE models' max_seq_len)."""
    ours = model(**fields)
    idx = tokens()
    with tempfile.TemporaryDirectory() as folder:
        theirs = load_transformers(export_hf(ours, Path(folder) / "hf"), **load)
        if type(theirs) is not expected:
            raise TypeError(f"exported as {type(theirs).__name__}, not {expected.__name__}")
        with torch.no_grad():
            return difference(ours(idx), theirs(idx).logits)


# Logits of float32 models a few layers deep: each 64-wide sum rounds at 2^-24 of its terms'
# size, and the two sides sum in other orders; a few 1e-6 is their noise (test_hf_families' ATOL).
LOGITS = 1e-5


# ----------------------------------------------------------------------------- absolute positions

