"""What every section shares: the config, the section registry, the timer.

- ``BenchConfig`` is the schema of ``configs/bench.yaml``: every default is stated here once,
  and every value is checked when it is built, each mistake a one-line error naming the key.
  ``reps`` and ``e2e_seconds`` default to null and are filled from ``quick`` (fewer and shorter
  measurements), so overriding ``quick`` alone still changes them.
- A section is a function registered with ``@section(name)``: it takes the config and the rows
  of the sections already run (``mfu`` reuses ``train``'s) and returns rows, flat dicts. The
  registry says which sections exist; the order they run in is ``only``'s.
- ``alternate`` times implementations side by side: one repetition of each in turn, the median
  of each after untimed warm-up rounds, so load from other processes hits them alike.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from nanoattn.config import PRESETS, ModelConfig, preset
from nanoattn.config.options import RECIPES, as_overrides
from nanoattn.model import check_forward_fits
from nanoattn.runtime import check_device_name, pick_device, synchronize
from nanoattn.validation import (
    as_float,
    check_bool,
    check_choice,
    check_positive_int,
    check_text,
    declared_defaults,
    fail,
    largest_departure,
)

Row = dict[str, Any]
Section = Callable[["BenchConfig", Mapping[str, list[Row]]], list[Row]]
SECTIONS: dict[str, Section] = {}  # filled by @section when nanoattn.bench imports the section modules
SHAPED = ("train", "mfu", "encodings", "attention")  # the sections that train at batch_size x seq_len
TRAIN_DTYPES = ("float32", "bfloat16")  # train measures both; decode and eval take one (bfloat16: autocast)
# The default recipe as key=value overrides of the dataclasses' defaults (speedrun.recipe).
DEFAULT_RECIPE = tuple(as_overrides(RECIPES["default"]))


@dataclass
class BenchConfig:
    """What the sections measure, and where. ``model``, ``batch_size``, ``seq_len``: train, mfu, eval,
    encodings, attention."""

    # The sections to run, in this order (mfu reuses train's rows when train ran first); speedrun
    # and labs (whole trainings) run only when named.
    only: list[str] = dataclasses.field(default_factory=lambda: [
        "train", "mfu", "profile", "decode", "eval", "e2e", "encodings", "attention", "sweep"])
    quick: bool = False  # fewer repetitions, shorter sequences (about 2 minutes in all)
    out: str | None = None  # the page's folder (bench.json and bench.md); None: runs/bench
    model: ModelConfig | str = "llama-small"  # a preset (max_seq_len becomes seq_len) or a ModelConfig
    batch_size: int = 8
    seq_len: int = 256  # train and mfu; eval's 1x (quick: 64)
    compile: bool = False  # train, profile, decode: also torch.compile'd steps (seconds to compile each)
    ckpt: str | None = None  # decode: a checkpoint or run directory instead of a random decode_model
    decode_model: ModelConfig | str = "llama-tiny"  # a preset name or a ModelConfig
    run: str | None = None  # e2e: a run directory written by scripts/train.py
    device: str = "cpu"  # cpu | cuda | mps | cuda:<index> | auto
    dtype: str = "float32"  # decode and eval: float32, or bfloat16 under autocast
    reps: int | None = None  # timed repetitions per measurement; null: 5 (quick: 3)
    threads: int | None = None  # torch CPU threads; null: torch's default
    e2e_seconds: float | None = None  # e2e: time the bare step at least this long; null: 30 (quick: 10)
    # train, mfu, profile: the step's recipe (optimizer, rates, a tied or untied head), key=value over
    # the dataclasses' defaults like speedrun's (train and mfu apply its model keys to `model`);
    # []: recipe=adamw_baseline
    train_recipe: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_RECIPE))
    # speedrun (not in the default list: two whole trainings, about 10 minutes on 2 CPU cores):
    # key=value over RunConfig's defaults on llama-tiny: by default recipe=adamw_baseline on SDPA's
    # attention kernel; [] gives it the default kernel choice
    speedrun_reference: list[str] = dataclasses.field(default_factory=lambda: ["model.attn_kernel=sdpa"])
    speedrun_candidate: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_RECIPE))
    speedrun_target: float = 2.044  # val_bpb: adamw_baseline's final value on the held-out plays
    speedrun_eval_interval: int = 100  # steps between the evaluations the curves are read from
    sweep: str | None = None  # sweep: a finished recipe sweep's folder of <recipe>/<seed> runs
    # labs (not in the default list: whole trainings, 1 + 2 x labs_repeats per lab): the command that
    # trains a lab's job ([]: scripts/bench.py gives its scripts/train.py, the command the lab scripts
    # run), each job's train.max_steps (null: the lab's own; quick does not shorten them), and the
    # rounds of an eager and a compiled job after the first compiled one
    trainer: list[str] = dataclasses.field(default_factory=list)
    labs_steps: int | None = None
    labs_repeats: int = 3

    def __post_init__(self) -> None:
        own = "bench"
        if isinstance(self.only, str):  # only=mfu: one section
            self.only = [self.only]
        if not isinstance(self.only, (list, tuple)) or not self.only:
            fail(own, "only", self.only, "must be a list of sections, e.g. only=[train,mfu]")
        for name in self.only:
            check_choice(own, "only", name, tuple(SECTIONS))
        for name in ("quick", "compile"):
            check_bool(own, name, getattr(self, name))
        for name in ("out", "ckpt", "run", "sweep"):
            if getattr(self, name) is not None:
                check_text(own, name, getattr(self, name))
        check_positive_int(own, "batch_size", self.batch_size)
        check_positive_int(own, "seq_len", self.seq_len)
        check_device_name(own, "device", self.device)
        check_choice(own, "dtype", self.dtype, TRAIN_DTYPES)
        if self.reps is None:
            self.reps = 3 if self.quick else 5
        check_positive_int(own, "reps", self.reps)
        if self.threads is not None:
            check_positive_int(own, "threads", self.threads)
        if self.e2e_seconds is None:
            self.e2e_seconds = 10.0 if self.quick else 30.0
        if not as_float(self.e2e_seconds) >= 0:
            fail(own, "e2e_seconds", self.e2e_seconds, "must be a number of seconds >= 0")
        if not isinstance(self.trainer, (list, tuple)) or not all(isinstance(p, str) for p in self.trainer):
            fail(own, "trainer", self.trainer, "must be a command as a list, e.g. [python, scripts/train.py]")
        self.trainer = list(self.trainer)
        if self.labs_steps is not None:
            check_positive_int(own, "labs_steps", self.labs_steps)
        check_positive_int(own, "labs_repeats", self.labs_repeats)
        for name in ("train_recipe", "speedrun_reference", "speedrun_candidate"):
            value = getattr(self, name)
            if not isinstance(value, (list, tuple)) or not all(isinstance(o, str) and "=" in o
                                                                for o in value):
                fail(own, name, value, "must be a list of key=value run overrides, e.g. [train.lr=0.01]")
            setattr(self, name, list(value))
        if not as_float(self.speedrun_target) > 0:
            fail(own, "speedrun_target", self.speedrun_target, "must be a positive val_bpb")
        check_positive_int(own, "speedrun_eval_interval", self.speedrun_eval_interval)
        self.model = _model_config("model", self.model, max_seq_len=self.seq_len)
        self.decode_model = _model_config("decode_model", self.decode_model)

    def torch_device(self) -> torch.device:
        return pick_device(self.device, key="bench.device")


DEFAULTS = declared_defaults(BenchConfig)


def _model_config(name: str, value: Any, **overrides: Any) -> ModelConfig:
    if isinstance(value, str):
        check_choice("bench", name, value, tuple(PRESETS))
        return preset(value, **overrides)
    if not isinstance(value, ModelConfig):
        fail("bench", name, value, "must be a model preset name or a ModelConfig")
    return value


def section(name: str) -> Callable[[Section], Section]:
    def register(fn: Section) -> Section:
        SECTIONS[name] = fn
        return fn
    return register


def run_sections(names: Iterable[str], cfg: BenchConfig,
                 on_done: Callable[[str, list[Row]], None] | None = None) -> dict[str, list[Row]]:
    """Run the named sections in order; each row gets its section's name first."""
    names = list(names)
    for name in names:  # all checked before the first one runs for minutes
        check_choice("bench", "only", name, tuple(SECTIONS))
    if set(names) & set(SHAPED):  # and their training steps' memory, before anything is allocated
        sizes = {name: (getattr(cfg, name), DEFAULTS[name]) for name in ("batch_size", "seq_len")}
        key = largest_departure(sizes)
        check_forward_fits(cfg.model, cfg.batch_size, cfg.seq_len, cfg.torch_device(),
                           ("bench", key, sizes[key][0]), training=True)
    done: dict[str, list[Row]] = {}
    for name in names:
        done[name] = [{"section": name, **row} for row in SECTIONS[name](cfg, done)]
        if on_done is not None:
            on_done(name, done[name])
    return done


def alternate(fns: Mapping[str, Callable[[], Any]], reps: int, device: torch.device,
              warmup: int = 1) -> dict[str, float]:
    """Median seconds per call of each fn, the fns called in turn ``reps`` times after ``warmup`` rounds."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            synchronize(device)
            if round_ >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) for name, t in times.items()}


def random_tokens(vocab_size: int, shape: tuple[int, ...], device: torch.device,
                  seed: int = 0) -> torch.Tensor:
    return torch.randint(0, vocab_size, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def shape_text(cfg: ModelConfig, batch: int | None = None, seq_len: int | None = None) -> str:
    text = f"d{cfg.d_model} L{cfg.n_layer} H{cfg.n_head}/{cfg.n_kv_head} ff{cfg.ffn_dim} V{cfg.vocab_size}"
    return text if batch is None else f"{text} B{batch} T{seq_len}"
