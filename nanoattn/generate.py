"""Sampling with an exact KV cache: logit filters, ``Decoding``, ``generate`` and text on top.

Design:
- ``Decoding`` is an iterator: each step appends one token per sequence. The first step
  prefills the whole prompt in one pass into a ``KVCache`` sized to prompt + max_new_tokens
  (never the model's maximum); every later step feeds only the token just chosen, at
  position ``cache.length``. Cached decoding is the same computation as re-encoding the
  whole sequence (tests check logits and greedy tokens for every encoding and attention
  layout); ``use_cache=False`` re-encodes instead, for comparison.
- Dynamic NTK changes the RoPE base with the length, and deeper layers' cached keys were computed
  under the old one: whenever the encoding says its rotation changed (``rotation_changes``) the
  cache starts over with the whole sequence, exact and, past the original length, as costly as none.
- The cache stores what the model computes in: the autocast dtype under autocast, else the
  parameters' dtype.
- The model's own ``check_length`` decides, before the first step, whether prompt +
  max_new_tokens is defined (a learned table is not past its size); this module never branches
  on the encoding's name. ``sliding_window=True`` instead re-encodes the last ``max_seq_len``
  tokens without a cache once the sequence is longer.
- Given positions (``positions`` [B, T + max_new_tokens], known in advance from the task's
  structure) go to the model with each step's tokens; the cache keeps each key's own.
- Logits become a token in a fixed order, as in transformers: repetition penalty (CTRL),
  temperature, then the registered filters top-k, top-p, min-p. ``temperature=0`` is greedy.
- A sequence ends when it picks a stop token; it then repeats that token, so the batch stays
  rectangular, and decoding ends early once every sequence has stopped.
- ``compile=True`` runs the one-token steps with the KV cache through ``torch.compile``: the whole
  step in a few fused kernels and the matmuls, not a Python call per operator. The prompt and the
  first token run eagerly (that step measures the kernels the graph then takes). A model shape
  compiles once, in seconds: the cache's length and size are symbolic in the graph, which serves
  every step, prompt and max_new_tokens (a new batch size compiles again). Compiled kernels sum in
  another order, so logits differ from eager ones by the rounding of the dtype they compute in (the
  last bits in float32, bf16's under bf16 autocast), and sampled text can diverge from there.
- Everything runs under ``torch.inference_mode()``; ``generate`` returns an ordinary tensor.
- A library: nothing here prints, picks a device or reads a checkpoint. Text on top (stop strings,
  streaming) is ``nanoattn.text``; the ``sample`` command line (``nanoattn.commands.sample``) reads
  the checkpoint and calls ``nanoattn.text.sample_text``.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import torch

from nanoattn.model import GPT, KVCache, StreamingCache, check_streamable
from nanoattn.model.cache import check_prune_threshold
from nanoattn.runtime import check_fits, compile_choice, use_compile_cache
from nanoattn.validation import check_bool, check_non_negative_int, fail, is_int

OWNER = "generate"


def _is_real(value: Any) -> bool:
    """A finite int or float, not a bool: what the sampling arithmetic takes (no numeric strings)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k largest logits [B, V] (ties with the k-th kept too); the rest become -inf."""
    kth = logits.topk(min(k, logits.shape[-1]), dim=-1).values[:, -1:]  # [B, 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2020): keep the smallest set of most likely tokens with mass >= p."""
    if p >= 1:  # everything; a float32 cumsum may reach 1 before the last tokens and drop them
        return logits
    probs, order = logits.softmax(dim=-1).sort(dim=-1, descending=True)  # [B, V] each
    # A token is dropped when the tokens ranked above it already hold mass p; the first never is.
    drop_sorted = probs.cumsum(dim=-1) - probs >= p  # [B, V]
    drop = drop_sorted.scatter(-1, order, drop_sorted)  # [B, V], back in vocabulary order
    return logits.masked_fill(drop, float("-inf"))


def min_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Min-p (Nguyen et al. 2024): keep tokens whose probability is at least p times the top one's."""
    probs = logits.softmax(dim=-1)  # [B, V]
    return logits.masked_fill(probs < p * probs.amax(dim=-1, keepdim=True), float("-inf"))


class LogitFilter(NamedTuple):
    apply: Callable[[torch.Tensor, Any], torch.Tensor]
    valid: Callable[[Any], bool]
    allowed: str


# Applied in this order after temperature; an argument of None skips its filter.
LOGIT_FILTERS: dict[str, LogitFilter] = {
    "top_k": LogitFilter(top_k_filter, lambda k: is_int(k) and k >= 1, "must be a positive integer or None"),
    "top_p": LogitFilter(top_p_filter, lambda p: _is_real(p) and 0 < p <= 1, "must be in (0, 1] or None"),
    "min_p": LogitFilter(min_p_filter, lambda p: _is_real(p) and 0 <= p <= 1, "must be in [0, 1] or None"),
}


def sample_categorical(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One index per row of probs [B, V] (rows summing to 1), drawn by inverting the CDF.

    Exact like ``torch.multinomial`` and faster on CPU. The draw stays strictly below the CDF's top,
    so a filtered-out token is never picked, even when float64 rounding puts the draw there.
    """
    cdf = probs.double().cumsum(dim=-1)  # [B, V]
    total = cdf[:, -1:]  # [B, 1]
    draw = torch.rand(total.shape, dtype=cdf.dtype, device=probs.device, generator=generator) * total
    draw = torch.minimum(draw, total.nextafter(torch.zeros_like(total)))
    return torch.searchsorted(cdf, draw, right=True).squeeze(-1)  # [B]


def apply_repetition_penalty(logits: torch.Tensor, idx: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty (Keskar et al. 2019) over tokens in idx [B, T]: positive logits [B, V] are
    divided by it, negative ones multiplied, once per distinct token however often it occurs."""
    seen = logits.gather(-1, idx)  # [B, T]
    return logits.scatter(-1, idx, torch.where(seen > 0, seen / penalty, seen * penalty))


def compute_dtype(model: GPT, device: torch.device) -> torch.dtype:
    """The dtype activations come out of the model's matmuls in: autocast's, else the weights'."""
    if torch.is_autocast_enabled(device.type):
        return torch.get_autocast_dtype(device.type)
    return model.tok_emb.weight.dtype


@contextlib.contextmanager
def _eval_mode(model: GPT):
    """Dropout off while decoding, the caller's mode back after (a no-op when already in eval mode)."""
    training = model.training
    if training:
        model.eval()
    try:
        yield
    finally:
        if training:
            model.train()


def step_logits(model: GPT, idx: torch.Tensor, positions: torch.Tensor | None,
                cache: KVCache | StreamingCache | None) -> torch.Tensor:
    """float32 logits [B, V] of the last of tokens idx [B, T], encoded after what ``cache`` holds."""
    hidden, _ = model.hidden_states(idx, positions, cache=cache)  # [B, T, d_model]
    return model.logits(hidden[:, -1]).float()  # only the last position is needed


@functools.cache  # made on first use: torch.compile imports Inductor, a cost no other process pays
def compiled_step_logits() -> Callable[..., torch.Tensor]:
    """``step_logits`` compiled, one function for every model: parameters are graph inputs, so models
    of one shape share a graph. The cache's length and size, and its buffers' slots, are symbolic
    from the first trace (``CACHE_SOURCES``), so that graph serves every step and prompt."""
    return torch.compile(step_logits)


# Dynamo source names, matched as regular expressions.
CACHE_SOURCES = ",".join(["L['cache'].length", "L['cache'].capacity",
                          r"L\['cache'\]\.(k|v|log_gates)\[\d+\]:2",
                          r"L\['cache'\]\.(selection\[\d+\]|positions):1"])


class Decoding:
    """Decode up to ``max_new_tokens`` after ``idx`` [B, T]; each ``next()`` returns the new tokens [B].

    ``streaming=(n_sink, window)`` decodes with StreamingLLM's cache (``StreamingCache``): the first
    n_sink tokens and the newest window ones, positions inside the cache, fixed memory for a
    stream of any length. Tokens are encoded a cache-full at a time until the cache is full, then
    one at a time, as the paper does.

    ``prune_threshold`` (selective attention only): context pruning, the keys whose accumulated
    selection F passes it are dropped from the cache for every later token (``model/selective.py``).
    ``positions`` [B, T + max_new_tokens] int64: each token's own position, if not 0, 1, 2, ...
    ``compile=True``: the one-token steps with the KV cache run compiled (``torch.compile``).

    ``idx`` is the prompt plus what was decoded so far, ``finished`` [B] marks sequences that
    picked a stop token, ``last_logits`` [B, V] float32 are the model's logits of the last step
    (before any penalty or filter), ``kv_cache_bytes`` is the cache's size (0 without one) and
    ``pruned_kv_bytes`` what pruning dropped from it. These are inference tensors: clone them
    outside ``torch.inference_mode`` before autograd sees them.
    """

    @torch.inference_mode()
    def __init__(self, model: GPT, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
                 repetition_penalty: float = 1.0, stop_tokens: Iterable[int] | None = None,
                 use_cache: bool = True, sliding_window: bool = False,
                 streaming: tuple[int, int] | None = None, prune_threshold: float | None = None,
                 generator: torch.Generator | None = None, vocab_limit: int | None = None,
                 positions: torch.Tensor | None = None, compile: bool = False) -> None:
        cfg = model.cfg
        if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.dtype != torch.long or idx.numel() == 0:
            fail(OWNER, "idx", getattr(idx, "shape", idx), "must be a non-empty int64 tensor [B, T]")
        if int(idx.min()) < 0 or int(idx.max()) >= cfg.vocab_size:
            fail(OWNER, "idx", (int(idx.min()), int(idx.max())), f"ids must lie in [0, {cfg.vocab_size})")
        check_non_negative_int(OWNER, "max_new_tokens", max_new_tokens)
        if not (_is_real(temperature) and temperature >= 0):
            fail(OWNER, "temperature", temperature, "must be a number >= 0 (0 is greedy)")
        if not (_is_real(repetition_penalty) and repetition_penalty > 0):
            fail(OWNER, "repetition_penalty", repetition_penalty, "must be a number > 0 (1 is none)")
        values = {"top_k": top_k, "top_p": top_p, "min_p": min_p}
        for name, value in values.items():
            if value is not None and not LOGIT_FILTERS[name].valid(value):
                fail(OWNER, name, value, LOGIT_FILTERS[name].allowed)
        stops = sorted(set(stop_tokens or ()))
        if any(not is_int(t) or not 0 <= t < cfg.vocab_size for t in stops):
            fail(OWNER, "stop_tokens", stops, f"must be token ids in [0, {cfg.vocab_size})")
        if vocab_limit is not None and not (is_int(vocab_limit) and 0 < vocab_limit <= cfg.vocab_size):
            fail(OWNER, "vocab_limit", vocab_limit, f"must be an integer in [1, {cfg.vocab_size}]")
        # Ids from vocab_limit on (a vocabulary rounded up past the tokenizer's) are never picked.
        self.vocab_limit = cfg.vocab_size if vocab_limit is None else vocab_limit

        if streaming is not None:
            sizes_ok = isinstance(streaming, Sequence) and len(streaming) == 2 and all(map(is_int, streaming))
            if not (sizes_ok and streaming[0] >= 0 and streaming[1] >= 1):
                fail(OWNER, "streaming", streaming, "must be (n_sink, window): integers >= 0 and >= 1, "
                     "or None")
            if sliding_window or not use_cache:
                fail(OWNER, "streaming", streaming, "is a KV cache: it needs use_cache=True and "
                     "sliding_window=False")
            check_streamable(cfg, OWNER, "streaming", streaming)
        check_prune_threshold(cfg, OWNER, "prune_threshold", prune_threshold)
        check_bool(OWNER, "compile", compile)
        if compile and not use_cache:
            fail(OWNER, "compile", compile, "compiles the one-token steps with the KV cache: it needs "
                 "use_cache=True")
        if compile:
            compile_choice(True, idx.device, f"{OWNER}.compile")  # refuses a machine without the compiler
            use_compile_cache()
        if prune_threshold is not None and (sliding_window or not use_cache):
            fail(OWNER, "prune_threshold", prune_threshold, "drops keys from the KV cache: it needs "
                 "use_cache=True and sliding_window=False")
        B, T = idx.shape
        self.end = T + max_new_tokens
        self.window = cfg.max_seq_len if sliding_window else None
        self.streaming = streaming
        self.positions = positions
        if positions is not None:
            if not (isinstance(positions, torch.Tensor) and positions.shape == (B, self.end)):
                fail(OWNER, "positions", getattr(positions, "shape", positions), f"must be a tensor [B, T + "
                     f"max_new_tokens] = [{B}, {self.end}]: the prompt's positions, then the new tokens'")
            model.check_positions(positions)  # the model's encodings refuse them, or their length
        elif streaming is not None:  # positions are cache slots: they stay below n_sink + window
            model.pos.check_length(sum(streaming))
        elif not sliding_window:
            try:
                model.pos.check_length(self.end)
            except ValueError as e:
                raise ValueError(f"prompt ({T}) + max_new_tokens ({max_new_tokens}) = {self.end} tokens: "
                                 f"{e}; sliding_window=True re-encodes the last {cfg.max_seq_len} tokens "
                                 f"at each step instead") from None
        check_fits(B * self.end * idx.element_size(), idx.device,
                   f"the token buffer for {B} sequence(s) x {self.end} tokens",
                   advice="ask for fewer samples or new tokens")
        self.model, self.device, self.compile = model, idx.device, compile
        self.eager_one_token_steps = False
        self.temperature, self.repetition_penalty, self.generator = temperature, repetition_penalty, generator
        self.filters = [(LOGIT_FILTERS[name].apply, value) for name, value in values.items()
                        if value is not None]
        self.stop_tokens = torch.tensor(stops, dtype=torch.long, device=self.device)
        self.has_stops = bool(stops)
        self.tokens = idx.new_empty(B, self.end)  # [B, T + max_new_tokens], filled up to self.length
        self.tokens[:, :T] = idx
        self.length = T
        self.finished = torch.zeros(B, dtype=torch.bool, device=self.device)
        self.last_logits: torch.Tensor | None = None
        self.filled_at = T  # the sequence length the cache's oldest entries were computed at
        # The cache only serves steps whose whole context fits the window; later ones re-encode.
        capacity = self.end if self.window is None else min(self.end, self.window)
        dtype = compute_dtype(model, self.device)
        if streaming is not None:
            self.cache = StreamingCache(cfg, B, *streaming, device=self.device, dtype=dtype)
        else:
            self.cache = (KVCache(cfg, B, capacity, device=self.device, dtype=dtype,
                                  prune_threshold=prune_threshold)
                          if use_cache and T <= capacity else None)
        self.streamed = 0  # tokens a streaming cache has been fed

    @property
    def idx(self) -> torch.Tensor:
        return self.tokens[:, :self.length]  # [B, length]

    @property
    def kv_cache_bytes(self) -> int:
        return 0 if self.cache is None else self.cache.nbytes

    @property
    def pruned_kv_bytes(self) -> int:
        return sum(self.cache.pruned_bytes()) if isinstance(self.cache, KVCache) else 0

    def __iter__(self) -> Decoding:
        return self

    @torch.inference_mode()
    def __next__(self) -> torch.Tensor:
        if self.length == self.end or (self.has_stops and bool(self.finished.all())):
            raise StopIteration
        with _eval_mode(self.model):
            self.last_logits = self._next_logits()  # [B, V]
        token = self._pick(self.last_logits)  # [B]
        if self.has_stops:  # without stop tokens no sequence ever stops
            token = torch.where(self.finished, self.tokens[:, self.length - 1], token)  # stopped: repeat
            self.finished |= torch.isin(token, self.stop_tokens)
        self.tokens[:, self.length] = token
        self.length += 1
        return token

    def _next_logits(self) -> torch.Tensor:
        if self.streaming is not None:
            return self._streamed_logits()
        context, length = self.idx, self.length  # [B, L]
        if self.window is not None and length > self.window:
            return self._last_logits(context[:, -self.window:], first=length - self.window)
        if self.cache is None:
            return self._last_logits(context)
        if self.cache.length and self.model.pos.rotation_changes(self.filled_at, length):
            self.cache.length = 0  # cached under another rotation: re-encode everything
        if self.cache.length == 0:
            self.filled_at = length
        # Everything not yet cached: the whole prompt at the first step, then the last token.
        return self._last_logits(context[:, self.cache.length:], self.cache, first=self.cache.length)

    def _streamed_logits(self) -> torch.Tensor:
        """Feed the tokens not yet streamed: as many as fit until the cache is full, then one at a time."""
        while True:
            piece = self.tokens[:, self.streamed:min(self.length, self.streamed + self.cache.next_piece())]
            logits = self._last_logits(piece, self.cache)
            self.streamed += piece.shape[1]
            if self.streamed == self.length:
                return logits

    def _last_logits(self, idx: torch.Tensor, cache: KVCache | StreamingCache | None = None,
                     first: int = 0) -> torch.Tensor:
        positions = None if self.positions is None else self.positions[:, first:first + idx.shape[1]]
        if self.compile and cache is not None and idx.shape[1] == 1:
            if self.eager_one_token_steps:
                # Contiguous: a slice of the token buffer has its length as stride, which a graph guards.
                with torch.compiler.config.patch(dynamic_sources=CACHE_SOURCES):
                    return compiled_step_logits()(self.model, idx.contiguous(), positions, cache)
            self.eager_one_token_steps = True  # the first runs eagerly: it measures the kernels it takes
        return step_logits(self.model, idx, positions, cache)

    def _pick(self, logits: torch.Tensor) -> torch.Tensor:
        if self.vocab_limit < logits.shape[-1]:
            logits = logits.clone()
            logits[:, self.vocab_limit:] = float("-inf")  # [B, V]: padding rows have no token
        if self.repetition_penalty != 1.0:
            logits = apply_repetition_penalty(logits, self.idx, self.repetition_penalty)
        if self.temperature == 0:
            return logits.argmax(dim=-1)  # every filter keeps the argmax, so none applies
        logits = logits / self.temperature
        for apply, value in self.filters:
            logits = apply(logits, value)
        return sample_categorical(logits.softmax(dim=-1), self.generator)  # [B]


def generate(model: GPT, idx: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, min_p: float | None = None,
             repetition_penalty: float = 1.0, stop_tokens: Iterable[int] | None = None,
             use_cache: bool = True, sliding_window: bool = False, streaming: tuple[int, int] | None = None,
             prune_threshold: float | None = None, generator: torch.Generator | None = None,
             vocab_limit: int | None = None, positions: torch.Tensor | None = None,
             compile: bool = False) -> torch.Tensor:
    """idx [B, T] -> [B, T + n]: n = max_new_tokens, or fewer when every sequence picked a stop token.

    A sequence that stopped early is padded with its stop token repeated. See ``Decoding``.
    """
    decoding = Decoding(model, idx, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                        min_p=min_p, repetition_penalty=repetition_penalty, stop_tokens=stop_tokens,
                        use_cache=use_cache, sliding_window=sliding_window, streaming=streaming,
                        prune_threshold=prune_threshold, generator=generator, vocab_limit=vocab_limit,
                        positions=positions, compile=compile)
    for _ in decoding:
        pass
    return decoding.idx.clone()  # cloned outside inference mode: an ordinary tensor
