"""Passkey retrieval (Mohtashami & Jaggi 2023; the protocol of the PI and YaRN papers), sized for tiny models.

A five-digit key sits at a chosen depth of filler text from the corpus, and the model must
repeat it at the end::

    <filler> The pass key is 12345. Remember it. <filler> What is the pass key? The pass key is 12345

Design choices:

- Token-level construction. Each piece is encoded on its own and the ids are concatenated, so the
  key is the same token ids where it is stated and where it is asked for (a BPE merge with the
  following "." cannot change it), and a sample has exactly the requested number of tokens:
  ``length + 1`` ids, i.e. ``length`` model inputs, like a perplexity window. The papers' long
  instruction preamble is dropped: at 128 tokens it would leave no room for filler.
- Depth d in [0, 1] puts ``round(d * F)`` of the F filler tokens before the key sentence: 0 is
  the start of the context, 1 right before the question.
- Scoring is teacher-forced on the key's tokens: the summed log-probability of the key, and an
  exact match when the argmax at every key position is the key's token (greedy decoding would
  produce exactly the key). Each (length, depth) cell averages ``samples`` keys, each with its
  own filler offset, all drawn from a seeded RNG so runs and encodings see the same samples.
- Training: ``PasskeyMix`` wraps the data layer's ``TokenData`` and replaces a fixed fraction of
  each training batch's rows with passkey samples at the training length (filler from the train
  split, uniform depth, random key), a pure function of (seed, step, micro_step, rank) like the
  batches it wraps, so resumption stays exact. The trainer uses it when ``train.passkey_fraction``
  is above 0; validation batches stay plain text. A passkey row's targets are the key's tokens
  only (the rest are ``IGNORE_INDEX``), as supervised fine-tuning scores only the answer: with
  the whole sample's next-token loss the 6 key tokens among 128 drowned in filler, and the
  lab's RoPE model stayed exactly at chance (ln 10 nats per digit) after 1,000 steps of
  passkey-only batches; scoring the key alone, the recipe (configs/experiment/passkey.yaml)
  reaches exact match 1.00 at the training length in 1,200 steps.
- This module builds samples and scores models; loading a run and writing its report is
  ``nanoattn.commands.eval_passkey``, the heat map ``plots.py``. ``dtype`` is the runtime
  vocabulary (``auto | float32 | bfloat16 | float16``), autocast by ``nanoattn.runtime``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nanoattn.data import TokenData
from nanoattn.eval.length import check_lengths
from nanoattn.eval.tables import format_table
from nanoattn.model import IGNORE_INDEX
from nanoattn.runtime import DTYPES, autocast, autocast_dtype
from nanoattn.validation import check_choice, check_positive_int

REPORT_STEM = "passkey"  # <run dir>/passkey[_<scaling>][_step<N>].json
KEY_DIGITS = 5
DEFAULT_DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)
_PASSKEY_STREAM = 0x7061737B  # first word of every passkey seed, apart from the loader's streams


class PasskeyTemplate:
    """The token ids of the fixed pieces of a passkey sample, for one tokenizer."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.stated = self._ids(" The pass key is")
        self.remember = self._ids(". Remember it.")
        self.question = self._ids(" What is the pass key? The pass key is")

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def key_ids(self, key: str) -> list[int]:
        return self._ids(" " + key)

    def overhead(self, key: str) -> int:
        """Tokens of a sample that are not filler."""
        return len(self.stated) + len(self.remember) + len(self.question) + 2 * len(self.key_ids(key))

    def sample(self, filler: np.ndarray, length: int, depth: float, key: str) -> tuple[torch.Tensor, int]:
        """(ids int64 [length + 1], number of key tokens at its end) with the key at ``depth``.

        ``filler`` holds at least ``length + 1 - overhead`` tokens; its first ones are used.
        """
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"passkey.depth={depth!r} is invalid: must be in [0, 1]")
        key_ids = self.key_ids(key)
        n_filler = length + 1 - self.overhead(key)
        if n_filler < 0:
            raise ValueError(f"passkey length {length} is too short: the passkey text alone takes "
                             f"{self.overhead(key)} tokens")
        filler = [int(t) for t in filler[:n_filler]]
        cut = round(depth * n_filler)
        ids = (filler[:cut] + self.stated + key_ids + self.remember + filler[cut:] + self.question + key_ids)
        return torch.tensor(ids, dtype=torch.long), len(key_ids)


def random_key(rng: np.random.Generator) -> str:
    """KEY_DIGITS digits, the first not 0 (so every key has the same number of digits)."""
    return str(int(rng.integers(10 ** (KEY_DIGITS - 1), 10**KEY_DIGITS)))


@torch.no_grad()
def score_passkey(model, samples: torch.Tensor, key_tokens: int,
                  dtype: str = "float32") -> tuple[torch.Tensor, torch.Tensor]:
    """samples int64 [B, T + 1] ending with ``key_tokens`` key ids -> (key log-prob [B], exact match [B])."""
    device = next(model.parameters()).device
    samples = samples.to(device)
    with autocast(device, autocast_dtype(dtype, device)[0]):
        logits = model(samples[:, :-1])[:, -key_tokens:].float()  # [B, K, V]: the predictions of the key
    targets = samples[:, -key_tokens:]  # [B, K]
    logprob = F.log_softmax(logits, dim=-1).gather(-1, targets[..., None])[..., 0].sum(-1)  # [B]
    exact = (logits.argmax(-1) == targets).all(-1)  # [B]
    return logprob.cpu(), exact.cpu()


def evaluate_passkey(model, tokenizer, filler: np.ndarray, lengths: Sequence[int],
                     depths: Sequence[float] = DEFAULT_DEPTHS, *, samples: int = 20, seed: int = 0,
                     batch_size: int = 4, dtype: str = "float32") -> list[dict[str, Any]]:
    """One record per (length, depth): mean key log-prob, exact-match accuracy; or an ``error``."""
    check_positive_int("passkey", "samples", samples)
    check_positive_int("passkey", "batch_size", batch_size)
    check_choice("passkey", "dtype", dtype, DTYPES)
    lengths = check_lengths("passkey", lengths)
    template = PasskeyTemplate(tokenizer)
    cells = []
    for length in lengths:
        for depth in depths:
            cell: dict[str, Any] = {"length": length, "depth": float(depth)}
            rng = np.random.default_rng([_PASSKEY_STREAM, seed, length, round(float(depth) * 1000)])
            try:
                if filler.size < length + 1:
                    raise ValueError(f"the filler split has {filler.size} tokens, fewer than length {length}")
                examples = []
                for _ in range(samples):
                    start = int(rng.integers(0, filler.size - length))
                    examples.append(template.sample(filler[start:start + length + 1], length, depth,
                                                    random_key(rng)))
                scores = [score_passkey(model, torch.stack([ids for ids, _ in examples[i:i + batch_size]]),
                                        examples[i][1], dtype) for i in range(0, samples, batch_size)]
            except ValueError as e:  # learned positions past their table, a length too short
                cell.update(logprob=None, accuracy=None, error=str(e).splitlines()[0])
            else:
                cell["logprob"] = torch.cat([lp for lp, _ in scores]).mean().item()
                cell["accuracy"] = torch.cat([ex for _, ex in scores]).float().mean().item()
            cells.append(cell)
    return cells


def passkey_table(report: Mapping[str, Any]) -> str:
    """Markdown: a row per depth, a column per length, exact-match accuracy (``n/a``: cannot run)."""
    lengths = sorted({c["length"] for c in report["results"]})
    depths = sorted({c["depth"] for c in report["results"]})
    cells = {(c["depth"], c["length"]): c.get("accuracy") for c in report["results"]}
    rows = ([f"{depth:g}", *(_accuracy(cells.get((depth, n))) for n in lengths)] for depth in depths)
    return format_table(["depth", *map(str, lengths)], rows)


def passkey_summary_table(reports: Sequence[Mapping[str, Any]], labels: Sequence[str]) -> str:
    """Markdown: a row per report, a column per length, accuracy averaged over the depths."""
    lengths = sorted({c["length"] for report in reports for c in report["results"]})
    rows = []
    for report, label in zip(reports, labels, strict=True):
        cells = []
        for length in lengths:
            scored = [c.get("accuracy") for c in report["results"] if c["length"] == length]
            cells.append(_accuracy(None if None in scored or not scored else sum(scored) / len(scored)))
        rows.append([label, *cells])
    return format_table(["run", *map(str, lengths)], rows)


def _accuracy(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


class PasskeyMix:
    """``TokenData`` whose training batches carry passkey samples in a fixed share of their rows."""

    def __init__(self, data: TokenData, fraction: float) -> None:
        if not 0.0 < fraction <= 1.0:
            raise ValueError(f"train.passkey_fraction={fraction!r} is invalid: must be in (0, 1]")
        self.data, self.fraction = data, fraction
        self.template = PasskeyTemplate(data.tokenizer)

    def __getattr__(self, name: str) -> Any:  # tokenizer, vocab_size, val_batches, ...: the wrapped data's
        return getattr(self.data, name)

    def train_batch(self, step: int, *, batch_size: int, seq_len: int, seed: int, micro_step: int = 0,
                    rank: int = 0, world_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """The wrapped batch (x, y) [B, T], its first round(fraction * B) rows replaced by passkey samples.

        A passkey row's targets are ``IGNORE_INDEX`` except the key's tokens at its end.
        """
        x, y = self.data.train_batch(step, batch_size=batch_size, seq_len=seq_len, seed=seed,
                                     micro_step=micro_step, rank=rank, world_size=world_size)
        n = round(self.fraction * batch_size)
        if n == 0:
            return x, y
        rng = np.random.default_rng([_PASSKEY_STREAM, seed, step, micro_step, rank])
        tokens = self.data.tokens("train")
        x, y = x.clone(), y.clone()
        for row in range(n):
            start = int(rng.integers(0, tokens.size - seq_len))
            ids, key_tokens = self.template.sample(tokens[start:start + seq_len + 1], seq_len,
                                                   float(rng.random()), random_key(rng))
            x[row], y[row] = ids[:-1], ids[1:]
            y[row, :-key_tokens] = IGNORE_INDEX
        return x, y
