"""The interface every attention mechanism implements: one module per mechanism, one registry line.

A mechanism is what a ``ModelConfig`` field switches on inside attention, beside the encoding: a
gate on the heads, a temperature, a mix of the heads' scores. Like ``PositionalEncoding`` it says,
in its own file, everything the rest of the package asks of it:

- its ``fields`` (the ``ModelConfig`` fields it reads; the plain model holds each at its declared
  default, so ``used`` needs no list of plain values) and their validation (``check_config``);
- where it acts, as hooks the attention layer calls in a fixed order, each the identity here:
  ``before_rotation`` and ``after_rotation`` (the projected queries and keys, before and after the
  encoding's rotation), ``queries`` (after the rotation and the encoding's scale), ``scores``
  (q.k / sqrt(d) before the encoding's bias and the mask), ``weights`` (after the score function)
  and ``heads`` (each head's output, before W_O). Attention calls the hooks of the mechanisms a
  layer uses in registry order;
- what it can take, as capabilities that the rules ask instead of its name: ``sdpa_computes``
  (False when it acts on scores or weights, which SDPA does not expose: attention then computes
  the scores explicitly, in query chunks), ``mixes_heads`` (True when a head's scores or weights
  depend on the other heads'), ``given_positions_refusal`` and ``paired_heads_refusal`` (why it cannot
  take per-token positions or differential attention's pairs of heads; None: it can);
- its head-analysis statistic (``statistic``), from its parameters or from what its hooks
  ``observe`` while head analysis records them, and the one number a lab shows (``headline``).

A mechanism keeps no state across calls, so cached decoding is exact by construction: a hook sees
the new queries' rows and, for ``scores`` and ``weights``, every key the cache holds.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from nanoattn.validation import declared_defaults


class Mechanism(nn.Module):
    fields: ClassVar[tuple[str, ...]] = ()
    # The attribute of the attention layer that holds it: its parameters' names in a checkpoint.
    attribute: ClassVar[str] = ""
    sdpa_computes: ClassVar[bool] = True
    mixes_heads: ClassVar[bool] = False
    given_positions_refusal: ClassVar[str | None] = None
    paired_heads_refusal: ClassVar[str | None] = None
    # True when its statistic needs a forward pass with ``observe`` recording (not its parameters alone).
    observes: ClassVar[bool] = False

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.first_query: int | None = None  # recording from this query on when an int (``record``)
        self.observed: torch.Tensor | None = None  # [heads] sums of what ``observe`` saw
        self.queries_observed = 0

    @classmethod
    def used(cls, cfg) -> bool:
        """Whether ``cfg`` switches it on: some field of it off its declared default."""
        defaults = declared_defaults(type(cfg))
        return any(getattr(cfg, name) != defaults[name] for name in cls.fields)

    @classmethod
    def check_config(cls, cfg) -> None:
        """Validate its fields, whether or not the model uses them, with a one-line ValueError naming
        the field, the bad value and what is allowed."""

    def before_rotation(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The projected queries [B, H, Tq, D] and keys [B, Hkv, Tk, D] before the encoding rotates them
        (called by the fused-QKV attention only: latent attention refuses a mechanism that acts here)."""
        return q, k

    def after_rotation(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same after the rotation, before the encoding's scale (Tk > Tq where a streaming cache
        places its keys afresh at each step)."""
        return q, k

    @classmethod
    def overrides(cls, hook: str) -> bool:
        """Whether it acts through ``hook`` (one of the methods above and below): it overrides it."""
        return getattr(cls, hook) is not getattr(Mechanism, hook)

    @classmethod
    def acts_after_rotation(cls, cfg) -> bool:
        """Whether, in a model of ``cfg``, it acts on the rotated heads (``after_rotation``), which it
        takes as head_dim numbers a head: an encoding whose map widens them refuses it."""
        return cls.overrides("after_rotation")

    @classmethod
    def acts_on_projections(cls) -> bool:
        """Whether it overrides ``before_rotation`` or ``after_rotation``."""
        return cls.overrides("before_rotation") or cls.overrides("after_rotation")

    def queries(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D] at positions [T] or [B, T] -> the queries attention uses."""
        return q

    def scores(self, scores: torch.Tensor) -> torch.Tensor:
        """scores [B, H, Tq, Tk], q.k / sqrt(d) of the visible and the masked keys alike, before the
        encoding's bias and the mask (called only when ``sdpa_computes`` is False)."""
        return scores

    def weights(self, weights: torch.Tensor) -> torch.Tensor:
        """weights [B, H, Tq, Tk] of the score function, 0 on the masked keys (called only when
        ``sdpa_computes`` is False)."""
        return weights

    def heads(self, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """x [B, T, d_model] the attention's input, y [B, heads, T, Dv] the heads' outputs, v
        [B, Hkv, T, Dv] the same tokens' values -> the heads' outputs W_O takes."""
        return y

    def record(self, first_query: int | None) -> None:
        """Start summing what ``observe`` is given from query ``first_query`` on (None: stop)."""
        self.first_query, self.observed, self.queries_observed = first_query, None, 0

    def observe(self, per_query: torch.Tensor) -> None:
        """Add a hook's per-query values [B, heads, T] to the sums while recording."""
        if self.first_query is None:
            return
        kept = per_query[..., self.first_query:].double()
        sums = kept.sum((0, 2)).cpu()
        self.observed = sums if self.observed is None else self.observed + sums
        self.queries_observed += kept.shape[0] * kept.shape[2]

    def observed_mean(self) -> torch.Tensor:
        """[heads]: the mean per query of what ``observe`` saw while recording."""
        return self.observed / max(self.queries_observed, 1)

    @classmethod
    def statistic(cls, layers: list[Mechanism], seq_len: int) -> dict[str, Any] | None:
        """Its statistic over the model's layers (``layers``, one per layer that uses it, after the
        recorded forward passes when ``observes``) at windows of ``seq_len``; None: it has none."""
        return None

    @classmethod
    def headline(cls, statistic: dict[str, Any]) -> tuple[str, float] | None:
        """The one number a lab's table shows of ``statistic``, and its label; None: none."""
        return None
