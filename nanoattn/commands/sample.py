"""``scripts/sample.py``: sample text from a checkpoint and print it.

- ``SampleConfig`` is the command's schema (``configs/sample.yaml`` states no value again); the
  sampling options themselves are checked where they are used, by ``nanoattn.generate.Decoding``.
- Device and dtype follow the one rule every command shares (``nanoattn.runtime``): ``auto`` is
  cuda, else mps, else cpu, and bfloat16 autocast where the hardware is fast at it.
- Text given on a command line cannot hold a newline, so ``prompt`` and ``stop`` read the escapes
  ``\\n``, ``\\t`` and ``\\\\``; ``prompt_file`` is read as is.
"""

from __future__ import annotations

import dataclasses
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import torch

from nanoattn.checkpoint import load_checkpoint
from nanoattn.data.tokenizer import EOT
from nanoattn.generate import Decoding
from nanoattn.runtime import (
    DTYPES,
    affordable,
    autocast,
    autocast_dtype,
    check_compile_choice,
    check_device_name,
    compile_choice,
    pick_device,
)
from nanoattn.text import sample_text
from nanoattn.validation import check_bool, check_choice, check_positive_int, check_seed, fail

OWNER = "sample"
_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
# The tokenizer's peak memory per byte of text it encodes, measured (HF tokenizers, the byte tokenizer:
# 252 bytes): a prompt file is read only up to what the machine's memory can tokenize.
TOKENIZE_BYTES_PER_BYTE = 256


def unescape(text: str) -> str:
    r"""Turn the escapes \n, \t and \\ into the characters: a shell and Hydra pass them literally."""
    return re.sub(r"\\([nt\\])", lambda m: _ESCAPES[m[1]], text)


@dataclass
class SampleConfig:
    """``scripts/sample.py``'s options; every default is stated here once."""

    ckpt: str | None = None  # a checkpoint directory, or a run directory (its latest checkpoint)
    prompt: str | None = None  # \n, \t, \\ are escapes; None with no prompt_file: start from <|endoftext|>
    prompt_file: str | None = None  # a UTF-8 file read as is (no escapes)
    max_new_tokens: int = 256
    num_samples: int = 1  # decoded as one batch (one after another with stream=true)
    temperature: float = 0.8  # 0 is greedy
    top_k: int | None = None  # keep the k most likely tokens
    top_p: float | None = None  # keep the smallest set of most likely tokens with mass >= top_p
    min_p: float | None = None  # keep tokens with probability >= min_p * the top token's
    repetition_penalty: float = 1.0  # CTRL: > 1 discourages tokens already in prompt or output
    stop: list[str] = dataclasses.field(default_factory=list)  # output ends before the first one
    seed: int = 1337  # same seed, same text
    stream: bool = False  # print text as it comes; samples are then decoded one at a time
    device: str = "auto"  # auto: cuda, else mps, else cpu (nanoattn.runtime.pick_device)
    dtype: str = "auto"  # auto: bfloat16 autocast where the hardware is fast at it, else float32
    sliding_window: bool = False  # past a learned table: re-encode the last max_seq_len tokens per step
    # StreamingLLM: [n_sink, window], the first n_sink tokens and the newest window ones in a fixed cache
    streaming_llm: list[int] | None = None
    rope_scaling: dict[str, Any] | None = None  # zero-shot RoPE scaling, e.g. {type: yarn, factor: 4}
    compile: bool | str = False  # compile the one-token decoding steps: true | false | auto

    def __post_init__(self) -> None:
        if not isinstance(self.ckpt, (str, Path)) or not str(self.ckpt):
            fail(OWNER, "ckpt", self.ckpt, "pass ckpt=<checkpoint or run directory>")
        if self.prompt is not None and self.prompt_file is not None:
            fail(OWNER, "prompt_file", self.prompt_file, "give prompt= or prompt_file=, not both")
        for name in ("max_new_tokens", "num_samples"):
            check_positive_int(OWNER, name, getattr(self, name))
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple)) or not all(isinstance(s, str) and s for s in self.stop):
            fail(OWNER, "stop", self.stop, "must be a list of non-empty strings")
        self.stop = [unescape(s) for s in self.stop]
        if self.prompt is not None:
            self.prompt = unescape(str(self.prompt))
        check_seed(OWNER, "seed", self.seed)
        for name in ("stream", "sliding_window"):
            check_bool(OWNER, name, getattr(self, name))
        check_device_name(OWNER, "device", self.device)
        check_choice(OWNER, "dtype", self.dtype, DTYPES)
        check_compile_choice(OWNER, "compile", self.compile)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Mapping):
            fail(OWNER, "rope_scaling", self.rope_scaling, "must be a mapping, e.g. {type: yarn, factor: 4}")


def read_prompt_file(path: str) -> str:
    """The file's text, read up to the bytes tokenizing can take (``TOKENIZE_BYTES_PER_BYTE``): a
    longer file (``/dev/zero``) is refused after reading one byte past that bound, never whole."""
    limit = affordable(TOKENIZE_BYTES_PER_BYTE, torch.device("cpu"))
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            fail(OWNER, "prompt_file", path, f"is longer than {limit:,} bytes, more than the memory of this "
                 f"machine can tokenize (about {TOKENIZE_BYTES_PER_BYTE} bytes a byte of text)")
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        reason = getattr(e, "strerror", None) or e
        raise ValueError(f"{OWNER}.prompt_file={path!r} cannot be read: {reason}") from None


def sample(cfg: SampleConfig, *, out: TextIO | None = None, err: TextIO | None = None) -> list[str]:
    """Load ``cfg.ckpt``, print the prompt followed by each continuation to ``out`` and a line of
    speed and KV-cache size to ``err``; return the continuations.

    Samples are decoded as one batch from one generator seeded with ``seed``; with ``stream``
    they are decoded one after another (a batch cannot be printed as it comes), sample i
    seeded with ``seed + i``. Either way the same seed gives the same text.
    """
    out, err = out or sys.stdout, err or sys.stderr
    device = pick_device(cfg.device, f"{OWNER}.device")
    dtype, _ = autocast_dtype(cfg.dtype, device)  # None: plain float32
    compile, _ = compile_choice(cfg.compile, device, f"{OWNER}.compile")
    prompt = read_prompt_file(cfg.prompt_file) if cfg.prompt_file else cfg.prompt or ""
    ckpt = load_checkpoint(cfg.ckpt, rope_scaling=cfg.rope_scaling, device=device)
    tokenizer = ckpt.tokenizer
    if tokenizer is None:
        raise ValueError(f"checkpoint {ckpt.path} has no tokenizer.json: it cannot turn text into tokens")
    eot = tokenizer.token_to_id(EOT)
    prompt_ids = tokenizer.encode(prompt).ids if prompt else [eot] if eot is not None else []
    if not prompt_ids:
        raise ValueError("sample.prompt is empty and the tokenizer has no <|endoftext|> to start from")
    options = dict(temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p, min_p=cfg.min_p,
                   repetition_penalty=cfg.repetition_penalty, sliding_window=cfg.sliding_window,
                   streaming=None if cfg.streaming_llm is None else tuple(cfg.streaming_llm),
                   stop_tokens=[] if eot is None else [eot], stop=cfg.stop, compile=compile)

    def run(num_samples: int, seed: int, on_text=None) -> tuple[list[str], Decoding]:
        generator = torch.Generator(device=device).manual_seed(seed)
        with autocast(device, dtype):
            return sample_text(ckpt.model, tokenizer, prompt_ids, cfg.max_new_tokens, num_samples=num_samples,
                               on_text=on_text, generator=generator, **options)

    def separate(i: int) -> None:
        if i:
            print("-" * 40, file=out)

    start = time.perf_counter()
    if cfg.stream:
        texts, decoded, cache_bytes = [], 0, 0
        for i in range(cfg.num_samples):
            separate(i)
            print(prompt, end="", file=out, flush=True)
            (text,), decoding = run(1, cfg.seed + i,
                                    lambda _, piece: print(piece, end="", file=out, flush=True))
            print(file=out, flush=True)
            texts.append(text)
            decoded += decoding.length - len(prompt_ids)
            cache_bytes = decoding.kv_cache_bytes
    else:
        texts, decoding = run(cfg.num_samples, cfg.seed)
        decoded = cfg.num_samples * (decoding.length - len(prompt_ids))
        cache_bytes = decoding.kv_cache_bytes
        for i, text in enumerate(texts):
            separate(i)
            print(prompt + text, file=out)
    seconds = time.perf_counter() - start
    print(f"decoded {decoded} tokens in {seconds:.2f} s ({decoded / seconds:.1f} tok/s, prefill included); "
          f"KV cache {cache_bytes:,} bytes ({dtype or torch.float32}, {device})", file=err)
    return texts
