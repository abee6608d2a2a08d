"""What a run trains on: the prepared corpus or a task's instances, wrapped as its config says.

- One rank prepares the data; the others then find it up to date.
- ``model.vocab_size`` follows the tokenizer: raised to it, or kept when larger (padding rows). A
  fine-tune (``train.init_from``) keeps its checkpoint's, which must cover the tokenizer.
- A task run (``task.name``) trains on ``TaskData``: the same ``train_batch``/``val_batches``
  contract, one instance a row with answer-only targets, drawn from seeds of the step, so resume
  stays exact; the row width is the task's largest training instance unless ``train.seq_len``
  says more.
- The wrappers, innermost first: the passkey mix (``train.passkey_fraction``), the task, then
  randomized positions (``train.random_positions``), whose batches carry each token's position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from nanoattn.checkpoint import resolve_checkpoint
from nanoattn.config import RunConfig
from nanoattn.data import TaskData, TokenData, digit_ids, load_tokenizer, open_prepared
from nanoattn.data.random_positions import RandomPositions
from nanoattn.eval.passkey import PasskeyMix
from nanoattn.train import distributed
from nanoattn.train.run_dir import resolve_init_from

Batches = TokenData | TaskData | RandomPositions  # anything with train_batch and val_batches


def training_data(cfg: RunConfig, dist: distributed.Dist,
                  say: Callable[[str], None]) -> tuple[Batches, TaskData | None, int]:
    """(the data a run draws its batches from, its task's data or None, the row width). Sets
    ``cfg.model``'s vocabulary (and Abacus digits) from the tokenizer."""
    if dist.is_main:  # one rank prepares, the others then find it up to date
        data = open_prepared(cfg.data)
    distributed.barrier(dist)
    if not dist.is_main:
        data = open_prepared(cfg.data)
    fit_vocab(cfg, data, say)
    if cfg.train.passkey_fraction > 0:  # the passkey recipe's data mix (configs/experiment/passkey.yaml)
        data = PasskeyMix(data, cfg.train.passkey_fraction)
    task, seq_len = None, cfg.seq_len
    if cfg.task.name is not None:  # a task of the suite instead of the corpus (docs/tasks.md)
        data = task = TaskData(data, cfg.task.build(), cfg.task.train_length,
                               curriculum_steps=cfg.task.curriculum_steps,
                               train_examples=cfg.task.train_examples)
        seq_len = task.check_seq_len(cfg.train.seq_len)
        limit = cfg.model.length_limit
        if limit is not None and seq_len > limit:
            raise ValueError(f"model.max_seq_len={limit} is invalid for task {cfg.task.name}: its instances "
                             f"need {seq_len} positions, and pos={cfg.model.pos!r} has learned ones only up "
                             "to max_seq_len")
    if cfg.train.random_positions is not None:  # Ruoss et al.: each training row at random ordered positions
        data = RandomPositions(data, cfg.train.random_positions)
    return data, task, seq_len


def resolved_run_config(values: Mapping[str, Any]) -> RunConfig:
    """The run config a run of ``values`` trains and records in its config.yaml (``out_dir`` as given):
    ``train.init_from``'s model, and the vocabulary and Abacus digits of its data's tokenizer,
    preparing the data if it is not yet."""
    cfg = resolve_init_from(values)
    fit_vocab(cfg, open_prepared(cfg.data), lambda line: None)
    return cfg


def fit_vocab(cfg: RunConfig, data: TokenData, say: Callable[[str], None]) -> None:
    """model.vocab_size and abacus_digits follow the tokenizer: vocab raised to it or kept when larger."""
    given, need = cfg.model.vocab_size, data.vocab_size
    if cfg.train.init_from is not None:
        if given < need:
            raise ValueError(f"train.init_from={cfg.train.init_from!r} has vocab_size={given}, smaller than "
                             f"the tokenizer of data {cfg.data.name!r} ({need})")
        source = resolve_checkpoint(cfg.train.init_from) / "tokenizer.json"
        data.check_tokenizer(load_tokenizer(source), source)
        return
    vocab = max(given, need)
    if vocab != given:
        cfg.model = dataclasses.replace(cfg.model, vocab_size=vocab)
        say(f"model.vocab_size={vocab}: raised from {given} to the tokenizer's vocabulary")
    elif given > need:
        say(f"model.vocab_size={given}: kept, {given - need} padding rows above the tokenizer's {need}")
    else:
        say(f"model.vocab_size={given}: the tokenizer's vocabulary")
    if cfg.model.abacus and cfg.model.abacus_digits is None:  # a checkpoint's are kept
        cfg.model = dataclasses.replace(cfg.model, abacus_digits=digit_ids(data.tokenizer))
