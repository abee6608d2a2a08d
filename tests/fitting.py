"""Shared by tests that check a model learns: a few AdamW steps on one fixed batch."""

from __future__ import annotations

import torch

from nanoattn import GPT


def fit(model: GPT, idx: torch.Tensor, steps: int = 30, lr: float = 1e-2) -> list[float]:
    """Train on next-token prediction of idx [B, T] for ``steps`` steps; the loss before each."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = model.loss(idx[:, :-1], idx[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses
