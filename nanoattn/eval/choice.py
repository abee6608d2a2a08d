"""Multiple choice by log-likelihood, HellaSwag-style, and the log-likelihoods lm-eval asks for.

- A continuation is scored by ``continuation_logprobs``: the sum of its tokens' log-probabilities
  after the context, and whether greedy decoding from the context would write it. A context starts
  with the tokenizer's end-of-text token (``with_start``), the start token of training rows, so an
  empty one is scored too. An input longer than the model's ``max_seq_len`` keeps its last tokens
  (the continuation's whole, the context's end), as lm-eval's own models do.
- Inputs are scored ``batch_size`` at a time, padded on the right: a causal model's outputs at the
  real tokens do not depend on the padding after them.
- ``score_choices`` scores items of a context, its choices and the index of the right one: ``acc``
  picks the choice of largest log-likelihood, ``acc_norm`` divides it by the choice's length in
  characters first (lm-eval's definitions, its delimiter " " between context and choice included),
  so a checkpoint scores the same here and through ``nanoattn.commands.harness`` on lm-eval's command line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nanoattn.data.loader import TokenData
from nanoattn.model import GPT

DELIMITER = " "  # lm-eval's target_delimiter: what joins a context and each choice


@dataclass(frozen=True)
class ChoiceItem:
    context: str
    choices: tuple[str, ...]
    gold: int  # the index of the right choice

    def __post_init__(self) -> None:
        if not self.choices or not 0 <= self.gold < len(self.choices):
            raise ValueError(f"a choice item's gold={self.gold!r} is invalid: must index one of its "
                             f"{len(self.choices)} choices")


def text_ids(data: TokenData, text: str) -> list[int]:
    """The ids of ``text`` (none for an empty one)."""
    return data.tokenizer.encode(text).ids if text else []


def with_start(data: TokenData, text: str) -> list[int]:
    """The ids of a context: the end-of-text start token, then the text's."""
    return [data.eot_id, *text_ids(data, text)]


@torch.no_grad()
def continuation_logprobs(model: GPT, pairs: Sequence[tuple[list[int], list[int]]], *,
                          batch_size: int = 32) -> list[tuple[float, bool]]:
    """(log p(continuation | context) in nats, is greedy) per (context ids, continuation ids), each
    context of at least one token."""
    limit = model.cfg.max_seq_len
    inputs = []
    for context, continuation in pairs:
        if not context or not continuation:
            raise ValueError("a context and a continuation of at least one token each are scored")
        if len(continuation) > limit:
            raise ValueError(f"a continuation of {len(continuation)} tokens is longer than the model's "
                             f"max_seq_len={limit}")
        inputs.append([*context, *continuation][-(limit + 1):])
    results: list[tuple[float, bool]] = []
    for first in range(0, len(inputs), batch_size):
        chunk = inputs[first:first + batch_size]
        width = max(len(tokens) for tokens in chunk) - 1
        x = torch.zeros((len(chunk), width), dtype=torch.long)  # the padding: any token id
        for row, tokens in enumerate(chunk):
            x[row, :len(tokens) - 1] = torch.tensor(tokens[:-1])
        hidden = model.hidden_states(x.to(model.tok_emb.weight.device))[0]  # [B, T, d_model]
        for row, (tokens, (_, continuation)) in enumerate(zip(chunk, pairs[first:], strict=False)):
            read = slice(len(tokens) - 1 - len(continuation), len(tokens) - 1)
            target = torch.tensor(continuation)
            # Logits at the continuation's positions only: [B, T, vocab] would not fit a long batch.
            scores = model.logits(hidden[row, read]).float().log_softmax(-1).cpu()  # [len(continuation), V]
            results.append((scores.gather(-1, target[:, None]).sum().item(),
                            bool((scores.argmax(-1) == target).all())))
    return results


def choice_pairs(data: TokenData, item: ChoiceItem) -> list[tuple[list[int], list[int]]]:
    """(context ids, delimiter + choice ids) per choice of ``item``."""
    context = with_start(data, item.context)
    return [(context, data.tokenizer.encode(DELIMITER + choice).ids) for choice in item.choices]


def score_choices(model: GPT, data: TokenData, items: Sequence[ChoiceItem], *,
                  batch_size: int = 32) -> dict[str, Any]:
    """``acc`` and ``acc_norm`` over ``items`` (lm-eval's multiple-choice metrics), and how many."""
    pairs = [pair for item in items for pair in choice_pairs(data, item)]
    scores = iter(continuation_logprobs(model, pairs, batch_size=batch_size))
    right, right_norm = 0, 0
    for item in items:
        logprobs = np.array([next(scores)[0] for _ in item.choices])
        right += int(np.argmax(logprobs)) == item.gold
        right_norm += int(np.argmax(logprobs / np.array([len(c) for c in item.choices]))) == item.gold
    return {"acc": right / len(items), "acc_norm": right_norm / len(items), "items": len(items)}
