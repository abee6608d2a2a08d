"""The schema of a training run: data, tokenizer, training loop, logger, and ``RunConfig``.

Like ``ModelConfig``, every dataclass validates every field in ``__post_init__`` with one-line errors;
a number is an int or a float (never a bool or a string) and finite. Building a config never touches
the disk: ``train.init_from`` is resolved by ``train()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from nanoattn.config.model import ModelConfig
from nanoattn.config.task import TaskConfig
from nanoattn.runtime import DEVICES, check_compile_choice
from nanoattn.validation import (
    as_float,
    check_bool,
    check_choice,
    check_non_negative_int,
    check_number,
    check_positive_int,
    check_seed,
    check_text,
    fail,
    from_dict,
)

TOKENIZER_TYPES = ("bpe", "char", "byte", "file")
CORPORA = ("shakespeare", "text", "rows", "hf")


@dataclass
class TokenizerConfig:
    """How text becomes token ids (see nanoattn/data/tokenizer.py)."""

    type: str = "bpe"  # bpe (byte-level, trained on the training split) | char | byte | file (a saved one)
    vocab_size: int = 2048  # bpe only, special tokens included; char and byte sizes follow from the data
    sample_chars: int = 100_000_000  # bpe and char learn from the training split's first this many characters
    path: str | None = None  # file: a tokenizer.json (tokenizers format) holding <|endoftext|>

    def __post_init__(self) -> None:
        own = "data.tokenizer"
        check_choice(own, "type", self.type, TOKENIZER_TYPES)
        check_positive_int(own, "vocab_size", self.vocab_size)
        check_positive_int(own, "sample_chars", self.sample_chars)
        if self.type == "file" or self.path is not None:  # needed by file, and a path wherever it is set
            check_text(own, "path", self.path)
        if self.type == "bpe" and self.vocab_size < 257:
            fail(own, "vocab_size", self.vocab_size,
                  "byte-level BPE needs at least 257 (256 byte tokens + <|endoftext|>)")


@dataclass
class DataConfig:
    """A corpus prepared into ``<root>/<name>/`` (see nanoattn/data/prepare.py)."""

    name: str = "shakespeare"  # folder under root; one prepared corpus per name
    corpus: str = "shakespeare"  # shakespeare | text | rows | hf
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    root: str = "data"  # relative paths resolve against the current working directory
    paths: list[str] = dataclasses.field(default_factory=list)  # text: a document a file; rows: jsonl/parquet
    val_fraction: float = 0.1  # text, rows, and hf without val_split: share of documents held out
    hf_name: str | None = None  # hf: hub dataset id, e.g. "roneneldan/TinyStories"
    hf_config: str | None = None  # hf: dataset configuration name, if it has several
    text_field: str = "text"  # rows, hf: the column holding each document's text
    train_split: str = "train"  # hf
    val_split: str | None = None  # hf: None holds out val_fraction of train_split
    seed: int = 0  # seeded choice of validation documents (text, rows, hf without val_split)
    shard_tokens: int = 100_000_000  # token ids per shard file (a split's last shard may hold fewer)

    def __post_init__(self) -> None:
        own = "data"
        check_text(own, "name", self.name)
        if self.name.startswith(".") or any(sep in self.name for sep in "/\\"):
            fail(own, "name", self.name, "must be a plain folder name (no '/', not starting with '.')")
        check_choice(own, "corpus", self.corpus, CORPORA)
        if isinstance(self.tokenizer, Mapping):
            self.tokenizer = from_dict(TokenizerConfig, self.tokenizer, owner="data.tokenizer")
        if not isinstance(self.tokenizer, TokenizerConfig):
            fail(own, "tokenizer", self.tokenizer, "must be a TokenizerConfig or a mapping")
        check_text(own, "root", self.root)
        if not isinstance(self.paths, (list, tuple)) or not all(isinstance(p, str) and p for p in self.paths):
            fail(own, "paths", self.paths, "must be a list of file or folder paths")
        self.paths = list(self.paths)
        if self.corpus in ("text", "rows") and not self.paths:
            fail(own, "paths", self.paths, f"corpus={self.corpus!r} needs at least one file or folder")
        check_number(own, "val_fraction", self.val_fraction, "must be in (0, 1)", lambda x: 0 < x < 1)
        if self.corpus == "hf" or self.hf_name is not None:  # needed by hf, and a name wherever it is set
            check_text(own, "hf_name", self.hf_name)
        for name in ("text_field", "train_split"):
            check_text(own, name, getattr(self, name))
        for name in ("hf_config", "val_split"):
            if getattr(self, name) is not None:
                check_text(own, name, getattr(self, name))
        check_seed(own, "seed", self.seed)
        check_positive_int(own, "shard_tokens", self.shard_tokens)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DataConfig:
        return from_dict(cls, values, owner="data")


SCHEDULES = ("cosine", "wsd", "constant")
OPTIMIZERS = ("adamw", "muon")
# float16 is not offered for training: without loss scaling its gradients underflow.
TRAIN_DTYPES = ("auto", "float32", "bfloat16")
LOGGERS = ("console", "wandb", "none")


@dataclass
class TrainConfig:
    """The training loop (nanoattn/train/loop.py). Defaults are the tuned CPU run of ``make train``."""

    seq_len: int | None = None  # None = model.max_seq_len
    batch_size: int = 8  # sequences per process and micro-step
    grad_accum: int = 1  # micro-steps per optimizer step; global batch = batch_size * grad_accum * world_size
    # Sequences per optimizer step over all processes, whatever their number: grad_accum follows from it
    # (global_batch / (batch_size x processes), at the run's start). None: grad_accum as given.
    global_batch: int | None = None
    max_steps: int = 2000  # optimizer steps
    lr: float = 3e-3  # peak learning rate
    min_lr: float | None = None  # None = lr / 10; the end of the cosine / WSD decay
    warmup_steps: int = 100  # linear warmup from lr / warmup_steps to lr
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay) | constant
    decay_fraction: float = 0.2  # wsd: share of max_steps spent decaying to min_lr (1-sqrt shape)
    # cosine: the steps it decays over, then min_lr held (nanoGPT's lr_decay_iters); None: max_steps
    decay_steps: int | None = None
    weight_decay: float = 0.1  # on matmul weights only (AdamW's, and Muon's with optimizer=muon)
    # adamw | muon: Muon for the blocks' 2-D weights, AdamW for the rest (nanoattn/train/optim.py)
    optimizer: str = "adamw"
    muon_lr_scale: float = 1.0  # optimizer=muon: Muon's peak lr = lr x this (its update is AdamW-RMS matched)
    muon_weight_decay: float | None = None  # optimizer=muon: Muon's weight decay; None = weight_decay
    muon_momentum: float = 0.95  # optimizer=muon: Muon's (Nesterov) momentum
    decay_embeddings: bool = False  # also decay token / position embeddings (norms and biases never)
    embedding_lr_scale: float = 1.0  # every nn.Embedding's peak lr = lr x this (token, value, position, T5)
    head_lr_scale: float = 1.0  # an untied LM head's peak lr = lr x this (tied: it is the token table)
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # max global gradient norm; 0 = no clipping
    eval_interval: int = 250  # evaluate every this many steps and at the end; 0 = only at the end
    eval_steps: int = 20  # validation batches (batch_size x world_size fixed windows each) per evaluation
    log_interval: int = 10  # steps per metrics.jsonl train record (train_loss is their mean)
    ckpt_interval: int = 500  # checkpoint every this many steps (and at the end); 0 = only at the end
    keep_last: int | None = 2  # checkpoints kept; None = all
    seed: int = 0  # model init, dropout and the training batches
    dtype: str = "auto"  # float32 | bfloat16 (autocast, fp32 master weights) | auto (bf16 where fast)
    compile: bool | str = False  # torch.compile the step: true | false | auto (runtime.compile_choice)
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | mps
    resume: Any = False  # false | true (latest checkpoint in out_dir) | a checkpoint or run directory
    # A checkpoint or run directory: its weights, a fresh optimizer, step 0. With resume, the run's own
    # checkpoint wins and init_from only shapes the model, so a fine-tune resumes with its own command.
    init_from: str | None = None
    passkey_fraction: float = 0.0  # share of each training batch made of passkey samples (eval/passkey.py)
    # A task run ends at the first evaluation whose exact match at 1x (fresh in-distribution instances,
    # logged as exact_1x) reaches this; null: it runs max_steps. Its last checkpoint records the value.
    stop_at_accuracy: float | None = None
    # Ruoss et al. 2023: each training row at an ordered random sample of positions from [0, this), an L
    # far past the training length (data/random_positions.py); evaluation uses 0..T-1. None: off.
    random_positions: int | None = None

    def __post_init__(self) -> None:
        own = "train"
        for name in ("batch_size", "grad_accum", "max_steps", "eval_steps", "log_interval"):
            check_positive_int(own, name, getattr(self, name))
        for name in ("warmup_steps", "eval_interval", "ckpt_interval"):
            check_non_negative_int(own, name, getattr(self, name))
        check_seed(own, "seed", self.seed)
        if self.seq_len is not None:
            check_positive_int(own, "seq_len", self.seq_len)
        if self.global_batch is not None:
            check_positive_int(own, "global_batch", self.global_batch)
            if self.global_batch % self.batch_size:
                fail(own, "global_batch", self.global_batch,
                     f"must be a multiple of train.batch_size={self.batch_size}")
        if self.keep_last is not None:
            check_positive_int(own, "keep_last", self.keep_last)
        for name in ("lr", "muon_lr_scale", "embedding_lr_scale", "head_lr_scale"):
            check_number(own, name, getattr(self, name), "must be a positive number")
        if self.min_lr is None:  # 12 digits: config.yaml shows 0.0003, not 0.00030000000000000003
            self.min_lr = float(f"{self.lr / 10:.12g}")
        if not 0 <= as_float(self.min_lr) <= self.lr:
            fail(own, "min_lr", self.min_lr, f"must be in [0, lr={self.lr}]")
        check_choice(own, "schedule", self.schedule, SCHEDULES)
        check_choice(own, "optimizer", self.optimizer, OPTIMIZERS)
        if self.muon_weight_decay is not None:
            check_number(own, "muon_weight_decay", self.muon_weight_decay,
                         "must be a non-negative number or null", lambda x: x >= 0)
        check_number(own, "muon_momentum", self.muon_momentum, "must be in [0, 1)", lambda x: 0 <= x < 1)
        check_number(own, "decay_fraction", self.decay_fraction, "must be in (0, 1]", lambda x: 0 < x <= 1)
        if self.decay_steps is not None:
            check_positive_int(own, "decay_steps", self.decay_steps)
            if self.schedule != "cosine":
                fail(own, "decay_steps", self.decay_steps, f"is cosine's; with schedule={self.schedule!r} "
                     "it must be null")
            if self.decay_steps <= self.warmup_steps:
                fail(own, "decay_steps", self.decay_steps,
                     f"must be more than warmup_steps={self.warmup_steps}")
        for name in ("weight_decay", "grad_clip"):
            check_number(own, name, getattr(self, name), "must be a non-negative number", lambda x: x >= 0)
        for name in ("beta1", "beta2"):
            check_number(own, name, getattr(self, name), "must be in [0, 1)", lambda x: 0 <= x < 1)
        check_bool(own, "decay_embeddings", self.decay_embeddings)
        check_compile_choice(own, "compile", self.compile)
        check_choice(own, "dtype", self.dtype, TRAIN_DTYPES)
        check_choice(own, "device", self.device, DEVICES)
        if not isinstance(self.resume, bool):
            check_text(own, "resume", self.resume)
        if self.init_from is not None:
            check_text(own, "init_from", self.init_from)
        check_number(own, "passkey_fraction", self.passkey_fraction, "must be in [0, 1]",
                     lambda x: 0 <= x <= 1)
        if self.stop_at_accuracy is not None:
            check_number(own, "stop_at_accuracy", self.stop_at_accuracy, "must be in (0, 1] or null",
                         lambda x: 0 < x <= 1)
        if self.random_positions is not None:
            check_positive_int(own, "random_positions", self.random_positions)

    def for_processes(self, world_size: int) -> TrainConfig:
        """This config on ``world_size`` processes: with ``global_batch``, its grad_accum. A grad_accum
        given beside it must be 1 or the one that follows (as a run's config.yaml records it)."""
        if self.global_batch is None:
            return self
        per_step = self.batch_size * world_size
        if self.global_batch % per_step:
            fail("train", "global_batch", self.global_batch,
                 f"must be a multiple of train.batch_size x processes = {self.batch_size} x {world_size}")
        grad_accum = self.global_batch // per_step
        if self.grad_accum not in (1, grad_accum):
            fail("train", "grad_accum", self.grad_accum,
                 f"must be 1 with train.global_batch={self.global_batch}: it follows from it ({grad_accum} "
                 f"on {world_size} process(es))")
        return dataclasses.replace(self, grad_accum=grad_accum)


@dataclass
class LoggerConfig:
    """Where metrics go besides ``metrics.jsonl``, which is always written (nanoattn/logging.py)."""

    type: str = "console"  # console (progress bar) | wandb (console too; offline unless logged in) | none
    project: str = "nanoattn"  # wandb project
    entity: str | None = None  # wandb entity (team or user); None = the account's default
    name: str | None = None  # wandb run name; None = the run directory's name
    tags: list[str] = dataclasses.field(default_factory=list)  # wandb tags

    def __post_init__(self) -> None:
        own = "logger"
        check_choice(own, "type", self.type, LOGGERS)
        check_text(own, "project", self.project)
        for name in ("entity", "name"):
            if getattr(self, name) is not None:
                check_text(own, name, getattr(self, name))
        if not isinstance(self.tags, (list, tuple)) or not all(isinstance(t, str) for t in self.tags):
            fail(own, "tags", self.tags, "must be a list of strings")
        self.tags = list(self.tags)


@dataclass
class RunConfig:
    """One training run: what ``scripts/train.py`` composes and ``nanoattn.train.train`` runs.

    With ``train.init_from``, the model's shape comes from that checkpoint and only the fields in
    ``nanoattn.checkpoint.INIT_OVERRIDABLE`` are taken from ``model`` (see docs/training.md).
    """

    out_dir: str = "runs/default"  # the run directory (config.yaml, metrics.jsonl, checkpoints/)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)  # name set: train on that task

    def __post_init__(self) -> None:
        check_text("run", "out_dir", self.out_dir)
        for name, cls in (("data", DataConfig), ("train", TrainConfig), ("logger", LoggerConfig),
                          ("task", TaskConfig)):
            if isinstance(getattr(self, name), Mapping):
                setattr(self, name, from_dict(cls, getattr(self, name), owner=name))
        if isinstance(self.model, Mapping):
            self.model = ModelConfig.from_dict(self.model)
        for name, cls in (("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig),
                          ("logger", LoggerConfig), ("task", TaskConfig)):
            if not isinstance(getattr(self, name), cls):
                fail("run", name, getattr(self, name), f"must be a {cls.__name__} or a mapping")
        limit = self.model.length_limit
        if limit is not None and self.seq_len > limit:
            fail("train", "seq_len", self.train.seq_len,
                  f"must be at most model.max_seq_len={limit} with pos={self.model.pos!r} "
                  "(its learned positions have no value past it)")

        if self.model.tie_embeddings and self.train.head_lr_scale != 1:
            # With init_from the model is the checkpoint's, whatever model keys the run set.
            tied = "model.tie_embeddings=true" + ("" if self.train.init_from is None else
                                                  f" (the model of train.init_from={self.train.init_from!r})")
            fail("train", "head_lr_scale", self.train.head_lr_scale,
                 f"must be 1 with {tied}: the head is the token table, which embedding_lr_scale sets")
        if self.train.stop_at_accuracy is not None:
            if self.task.name is None:
                fail("train", "stop_at_accuracy", self.train.stop_at_accuracy,
                     "needs a task (task.name): it is the exact match of the task's answers at 1x")
            if self.train.eval_interval == 0:
                fail("train", "stop_at_accuracy", self.train.stop_at_accuracy,
                     "needs train.eval_interval > 0: the accuracy is measured at each evaluation")
        self._check_random_positions()
        self._check_coupling()
        if self.task.name is not None and self.train.passkey_fraction > 0:
            fail("train", "passkey_fraction", self.train.passkey_fraction,
                 "must be 0 with a task: passkey samples replace corpus rows, and a task run has none")

    def _check_random_positions(self) -> None:
        length = self.train.random_positions
        if length is None:
            return
        refusal = self.model.positions_refusal
        if refusal is not None:
            fail("train", "random_positions", length, f"needs encodings that take given positions: {refusal}")
        if self.task.position_coupling:
            fail("train", "random_positions", length, "must be null with task.position_coupling=true: both "
                 "set the positions")
        limit = self.model.length_limit
        if limit is not None and length > limit:
            fail("train", "random_positions", length, f"must be at most model.max_seq_len={limit} with "
                 f"pos={self.model.pos!r} (its learned positions have no value past it)")
        if self.task.name is None and length < self.seq_len:
            fail("train", "random_positions", length, f"must be at least the training length {self.seq_len}: "
                 "each row draws that many distinct positions")

    def _check_coupling(self) -> None:
        if not self.task.position_coupling:
            return
        refusal = self.model.positions_refusal
        if refusal is not None:
            fail("task", "position_coupling", True, f"needs encodings that take given positions: {refusal}")
        limit = self.model.length_limit
        if limit is not None and self.task.max_position >= limit:
            fail("task", "max_position", self.task.max_position, f"must be below model.max_seq_len={limit} "
                 f"with pos={self.model.pos!r} (its learned positions have no value past it)")

    @property
    def seq_len(self) -> int:
        """The training context: train.seq_len, or model.max_seq_len when that is None."""
        return self.train.seq_len or self.model.max_seq_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        return from_dict(cls, values, owner="run")
