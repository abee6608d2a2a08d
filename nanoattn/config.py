"""Typed configuration: the one schema for models (and, below, data and training).

Every dataclass validates itself in ``__post_init__`` and raises a one-line ``ValueError``
that names the field, the bad value and what is allowed. Nothing here imports Hydra: the
scripts register these classes with Hydra's ConfigStore, the library only sees dataclasses.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

NORMS = ("layernorm", "rmsnorm")
MLPS = ("gelu", "swiglu")


def _fail(owner: str, name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{owner}.{name}={value!r} is invalid: {allowed}")


def _check_choice(owner: str, name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        _fail(owner, name, value, "allowed: " + " | ".join(choices))


def _check_positive_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        _fail(owner, name, value, "must be a positive integer")


def from_dict(cls, values: Mapping[str, Any] | None, owner: str | None = None):
    """Build dataclass ``cls`` from a mapping, naming any unknown key in a one-line error."""
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        where = owner or cls.__name__
        raise ValueError(f"unknown key(s) {', '.join(where + '.' + k for k in unknown)}; "
                         f"allowed: {', '.join(sorted(names))}")
    return cls(**values)


@dataclass
class ModelConfig:
    """A decoder-only GPT. Defaults give a small LLaMA-style model that trains on a CPU."""

    vocab_size: int = 2048
    d_model: int = 128
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int | None = None  # None = n_head (MHA); a divisor of n_head (GQA); 1 (MQA)
    d_ff: int | None = None  # None = 4*d_model (gelu) or 8/3*d_model rounded up to ffn_multiple_of (swiglu)
    ffn_multiple_of: int = 256  # LLaMA's rounding of the SwiGLU width
    max_seq_len: int = 256  # training context; the learned table's size
    pos: str = "rope"  # sinusoidal | learned | rope | alibi | nope
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None  # None or {"type": ..., "factor": ..., ...}
    norm: str = "rmsnorm"  # layernorm | rmsnorm
    norm_eps: float = 1e-5
    mlp: str = "swiglu"  # gelu | swiglu
    bias: bool = False  # biases in every linear layer and LayerNorm
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self) -> None:
        own = "model"
        for name in ("vocab_size", "d_model", "n_layer", "n_head", "max_seq_len", "ffn_multiple_of"):
            _check_positive_int(own, name, getattr(self, name))
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        _check_positive_int(own, "n_kv_head", self.n_kv_head)
        if self.n_head % self.n_kv_head:
            _fail(own, "n_kv_head", self.n_kv_head,
                  f"must divide n_head={self.n_head} (MHA: n_kv_head=n_head, MQA: 1)")
        if self.d_model % self.n_head:
            _fail(own, "d_model", self.d_model, f"must be divisible by n_head={self.n_head}")
        from nanoattn.model.positional import REGISTRY

        _check_choice(own, "pos", self.pos, tuple(REGISTRY))
        _check_choice(own, "norm", self.norm, NORMS)
        _check_choice(own, "mlp", self.mlp, MLPS)
        if self.d_ff is not None:
            _check_positive_int(own, "d_ff", self.d_ff)
        if self.pos == "rope" and self.head_dim % 2:
            _fail(own, "d_model", self.d_model,
                  f"pos='rope' needs an even head_dim, got d_model/n_head={self.head_dim}")
        if _as_float(self.rope_theta) <= 0:
            _fail(own, "rope_theta", self.rope_theta, "must be a positive number")
        if not (isinstance(self.dropout, (int, float)) and 0.0 <= self.dropout < 1.0):
            _fail(own, "dropout", self.dropout, "must be in [0, 1)")
        if not (isinstance(self.norm_eps, (int, float)) and self.norm_eps > 0):
            _fail(own, "norm_eps", self.norm_eps, "must be a positive number")
        if not (isinstance(self.init_std, (int, float)) and self.init_std > 0):
            _fail(own, "init_std", self.init_std, "must be a positive number")
        if self.rope_scaling is not None:
            if self.pos != "rope":
                _fail(own, "rope_scaling", dict(self.rope_scaling),
                      f"only applies to pos='rope', this model has pos={self.pos!r}")
            from nanoattn.model.positional.rope_scaling import normalize_rope_scaling

            self.rope_scaling = normalize_rope_scaling(self.rope_scaling, self.max_seq_len)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    @property
    def ffn_dim(self) -> int:
        if self.d_ff is not None:
            return self.d_ff
        if self.mlp == "gelu":
            return 4 * self.d_model
        hidden = int(2 * 4 * self.d_model / 3)
        return self.ffn_multiple_of * math.ceil(hidden / self.ffn_multiple_of)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ModelConfig:
        return from_dict(cls, values, owner="model")


def _as_float(value: Any) -> float:
    """A number for range checks; non-numbers become NaN so every comparison fails."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


# Model presets as data. Hydra's configs/model/*.yaml mirror these; tests count their parameters.
PRESETS: dict[str, dict[str, Any]] = {
    # GPT-2 small (Radford et al. 2019): 124,439,808 parameters with tied embeddings.
    "gpt2-small": dict(vocab_size=50257, d_model=768, n_layer=12, n_head=12, max_seq_len=1024,
                       pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True),
    # LLaMA-7B shape (Touvron et al. 2023): 6,738,415,616 parameters.
    "llama-7b": dict(vocab_size=32000, d_model=4096, n_layer=32, n_head=32, max_seq_len=2048,
                     pos="rope", norm="rmsnorm", mlp="swiglu", bias=False, tie_embeddings=False,
                     norm_eps=1e-6),
    # CPU-sized presets (the defaults of the Hydra configs).
    "gpt-tiny": dict(vocab_size=2048, d_model=128, n_layer=4, n_head=4, d_ff=512, max_seq_len=256,
                     pos="learned", norm="layernorm", mlp="gelu", bias=True, tie_embeddings=True),
    "llama-tiny": dict(vocab_size=2048, d_model=128, n_layer=4, n_head=4, n_kv_head=2, d_ff=384,
                       max_seq_len=256, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                       tie_embeddings=True),
    "llama-small": dict(vocab_size=4096, d_model=384, n_layer=6, n_head=6, n_kv_head=2, d_ff=1024,
                        max_seq_len=256, pos="rope", norm="rmsnorm", mlp="swiglu", bias=False,
                        tie_embeddings=False),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A ModelConfig from a named preset, with field overrides."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; allowed: {' | '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})




TOKENIZER_TYPES = ("bpe", "char", "byte")
CORPORA = ("shakespeare", "text", "hf")


def _check_text(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip():
        _fail(owner, name, value, "must be a non-empty string")


@dataclass
class TokenizerConfig:
    """How text becomes token ids (see nanoattn/data/tokenizer.py)."""

    type: str = "bpe"  # bpe (byte-level, trained on the training split) | char | byte
    vocab_size: int = 2048  # bpe only, special tokens included; char and byte sizes follow from the data

    def __post_init__(self) -> None:
        own = "data.tokenizer"
        _check_choice(own, "type", self.type, TOKENIZER_TYPES)
        _check_positive_int(own, "vocab_size", self.vocab_size)
        if self.type == "bpe" and self.vocab_size < 257:
            _fail(own, "vocab_size", self.vocab_size,
                  "byte-level BPE needs at least 257 (256 byte tokens + <|endoftext|>)")


@dataclass
class DataConfig:
    """A corpus prepared into ``<root>/<name>/`` (see nanoattn/data/prepare.py)."""

    name: str = "shakespeare"  # folder under root; one prepared corpus per name
    corpus: str = "shakespeare"  # shakespeare | text | hf
    tokenizer: TokenizerConfig = dataclasses.field(default_factory=TokenizerConfig)
    root: str = "data"  # relative paths resolve against the current working directory
    paths: list[str] = dataclasses.field(default_factory=list)  # text: files or folders, one document a file
    val_fraction: float = 0.1  # text, and hf without val_split: share of documents held out
    hf_name: str | None = None  # hf: hub dataset id, e.g. "roneneldan/TinyStories"
    hf_config: str | None = None  # hf: dataset configuration name, if it has several
    text_field: str = "text"  # hf: the column holding each document's text
    train_split: str = "train"  # hf
    val_split: str | None = None  # hf: None holds out val_fraction of train_split
    seed: int = 0  # seeded choice of validation documents (text, hf without val_split)

    def __post_init__(self) -> None:
        own = "data"
        _check_text(own, "name", self.name)
        if self.name.startswith(".") or any(sep in self.name for sep in "/\\"):
            _fail(own, "name", self.name, "must be a plain folder name (no '/', not starting with '.')")
        _check_choice(own, "corpus", self.corpus, CORPORA)
        if isinstance(self.tokenizer, Mapping):
            self.tokenizer = from_dict(TokenizerConfig, self.tokenizer, owner="data.tokenizer")
        if not isinstance(self.tokenizer, TokenizerConfig):
            _fail(own, "tokenizer", self.tokenizer, "must be a TokenizerConfig or a mapping")
        _check_text(own, "root", self.root)
        if not isinstance(self.paths, (list, tuple)) or not all(isinstance(p, str) and p for p in self.paths):
            _fail(own, "paths", self.paths, "must be a list of file or folder paths")
        self.paths = list(self.paths)
        if self.corpus == "text" and not self.paths:
            _fail(own, "paths", self.paths, "corpus='text' needs at least one file or folder")
        if not 0.0 < _as_float(self.val_fraction) < 1.0:
            _fail(own, "val_fraction", self.val_fraction, "must be in (0, 1)")
        if self.corpus == "hf":
            _check_text(own, "hf_name", self.hf_name)
        for name in ("text_field", "train_split"):
            _check_text(own, name, getattr(self, name))
        for name in ("hf_config", "val_split"):
            if getattr(self, name) is not None:
                _check_text(own, name, getattr(self, name))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            _fail(own, "seed", self.seed, "must be a non-negative integer")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> DataConfig:
        return from_dict(cls, values, owner="data")


SCHEDULES = ("cosine", "wsd", "constant")
DTYPES = ("auto", "float32", "bfloat16")
DEVICES = ("auto", "cpu", "cuda", "mps")
LOGGERS = ("console", "wandb", "none")


def _check_non_negative_int(owner: str, name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail(owner, name, value, "must be a non-negative integer")


def _check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        _fail(owner, name, value, "must be true or false")


@dataclass
class TrainConfig:
    """The training loop (nanoattn/train/loop.py). Defaults are the tuned CPU run of ``make train``."""

    seq_len: int | None = None  # None = model.max_seq_len
    batch_size: int = 8  # sequences per process and micro-step
    grad_accum: int = 1  # micro-steps per optimizer step; global batch = batch_size * grad_accum * world_size
    max_steps: int = 2000  # optimizer steps
    lr: float = 3e-3  # peak learning rate
    min_lr: float | None = None  # None = lr / 10; the end of the cosine / WSD decay
    warmup_steps: int = 100  # linear warmup from lr / warmup_steps to lr
    schedule: str = "cosine"  # cosine | wsd (warmup-stable-decay) | constant
    decay_fraction: float = 0.2  # wsd: share of max_steps spent decaying to min_lr (1-sqrt shape)
    weight_decay: float = 0.1  # AdamW, on matmul weights only
    decay_embeddings: bool = False  # also decay token / position embeddings (norms and biases never)
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
    compile: bool = False  # torch.compile the model (tens of seconds to compile on a CPU)
    device: str = "auto"  # auto (cuda > mps > cpu) | cpu | cuda | mps
    resume: Any = False  # false | true (latest checkpoint in out_dir) | a checkpoint or run directory
    # A checkpoint or run directory: its weights, a fresh optimizer, step 0. With resume, the run's own
    # checkpoint wins and init_from only shapes the model, so a fine-tune resumes with its own command.
    init_from: str | None = None
    passkey_fraction: float = 0.0  # share of each training batch made of passkey samples (eval/passkey.py)

    def __post_init__(self) -> None:
        own = "train"
        for name in ("batch_size", "grad_accum", "max_steps", "eval_steps", "log_interval"):
            _check_positive_int(own, name, getattr(self, name))
        for name in ("warmup_steps", "eval_interval", "ckpt_interval", "seed"):
            _check_non_negative_int(own, name, getattr(self, name))
        if self.seq_len is not None:
            _check_positive_int(own, "seq_len", self.seq_len)
        if self.keep_last is not None:
            _check_positive_int(own, "keep_last", self.keep_last)
        if not _as_float(self.lr) > 0:
            _fail(own, "lr", self.lr, "must be a positive number")
        if self.min_lr is None:  # 12 digits: config.yaml shows 0.0003, not 0.00030000000000000003
            self.min_lr = float(f"{self.lr / 10:.12g}")
        if not 0 <= _as_float(self.min_lr) <= self.lr:
            _fail(own, "min_lr", self.min_lr, f"must be in [0, lr={self.lr}]")
        _check_choice(own, "schedule", self.schedule, SCHEDULES)
        if not 0 < _as_float(self.decay_fraction) <= 1:
            _fail(own, "decay_fraction", self.decay_fraction, "must be in (0, 1]")
        for name in ("weight_decay", "grad_clip"):
            if not _as_float(getattr(self, name)) >= 0:
                _fail(own, name, getattr(self, name), "must be a non-negative number")
        for name in ("beta1", "beta2"):
            if not 0 <= _as_float(getattr(self, name)) < 1:
                _fail(own, name, getattr(self, name), "must be in [0, 1)")
        for name in ("decay_embeddings", "compile"):
            _check_bool(own, name, getattr(self, name))
        _check_choice(own, "dtype", self.dtype, DTYPES)
        _check_choice(own, "device", self.device, DEVICES)
        if not isinstance(self.resume, bool):
            _check_text(own, "resume", self.resume)
        if self.init_from is not None:
            _check_text(own, "init_from", self.init_from)
        if not 0 <= _as_float(self.passkey_fraction) <= 1:
            _fail(own, "passkey_fraction", self.passkey_fraction, "must be in [0, 1]")


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
        _check_choice(own, "type", self.type, LOGGERS)
        _check_text(own, "project", self.project)
        for name in ("entity", "name"):
            if getattr(self, name) is not None:
                _check_text(own, name, getattr(self, name))
        if not isinstance(self.tags, (list, tuple)) or not all(isinstance(t, str) for t in self.tags):
            _fail(own, "tags", self.tags, "must be a list of strings")
        self.tags = list(self.tags)


@dataclass
class RunConfig:
    """One training run: what ``scripts/train.py`` composes and ``nanoattn.train.train`` runs.

    With ``train.init_from``, the model's shape comes from that checkpoint and only the fields in
    ``nanoattn.train.checkpoint.INIT_OVERRIDABLE`` are taken from ``model`` (see docs/training.md).
    """

    out_dir: str = "runs/default"  # the run directory (config.yaml, metrics.jsonl, checkpoints/)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    logger: LoggerConfig = dataclasses.field(default_factory=LoggerConfig)

    def __post_init__(self) -> None:
        _check_text("run", "out_dir", self.out_dir)
        for name, cls in (("data", DataConfig), ("train", TrainConfig), ("logger", LoggerConfig)):
            if isinstance(getattr(self, name), Mapping):
                setattr(self, name, from_dict(cls, getattr(self, name), owner=name))
        if self.train.init_from is not None:
            from nanoattn.train.checkpoint import init_model_config

            model = self.model.to_dict() if isinstance(self.model, ModelConfig) else self.model
            self.model = init_model_config(self.train.init_from, model)
        elif isinstance(self.model, Mapping):
            self.model = ModelConfig.from_dict(self.model)
        for name, cls in (("model", ModelConfig), ("data", DataConfig), ("train", TrainConfig),
                          ("logger", LoggerConfig)):
            if not isinstance(getattr(self, name), cls):
                _fail("run", name, getattr(self, name), f"must be a {cls.__name__} or a mapping")
        if self.model.pos == "learned" and self.seq_len > self.model.max_seq_len:
            _fail("train", "seq_len", self.train.seq_len,
                  f"must be at most model.max_seq_len={self.model.max_seq_len} with pos='learned' "
                  "(the position table has no rows past it)")

    @property
    def seq_len(self) -> int:
        """The training context: train.seq_len, or model.max_seq_len when that is None."""
        return self.train.seq_len or self.model.max_seq_len

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RunConfig:
        return from_dict(cls, values, owner="run")
