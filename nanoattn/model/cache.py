"""A preallocated KV cache holding n_kv_head heads per layer.

It is sized to what will be decoded (prompt + new tokens), not to the model's maximum: a
cache of the maximum size makes every decoding step attend over empty slots. The next
token's position is the number of tokens already cached. GQA and MQA shrink it by
n_head / n_kv_head, since only the shared K/V heads are stored. Its size is checked against the
device's memory before anything is allocated, so a huge batch or length is a one-line error.

A sliding-window layer (window W) keeps only its newest W - 1 keys and values, all that the next
token sees besides itself: a rolling buffer, so its memory does not grow with the length. Its
buffer is kept in position order (newest last), so attention reads keys at consecutive positions
ending at the current one, as for a global layer.

Tokens given their own positions (``GPT.forward(idx, positions)``, [B, T]) keep them: the cache
records every token's position once, for all layers ([B, capacity] int64, made at the first such
call), and each key is read back at its own (``key_positions``). A sequence takes one kind of
positions throughout: default ones (the next token's is ``length``) or given ones.

With FoX's forget gates (``forget_gate``) each layer also keeps every cached token's log gate per
query head (float32), beside its key and value and in the same slots: attention sums them afresh
over what is held, so the decay between a key and its query is the same sum of the same numbers as
in recomputation.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import torch

from nanoattn.positional import REGISTRY
from nanoattn.runtime import check_fits
from nanoattn.validation import as_float, fail


def check_streamable(cfg, owner: str, name: str, value: Any) -> None:
    """StreamingLLM's one rule, asked of the encodings' capabilities: a ``StreamingCache`` moves
    tokens to other positions as it evicts, which only positions applied inside attention allow;
    an encoding that adds them to the embeddings (``acts_on_embeddings``: sinusoidal, learned)
    has them baked into every cached value. Refused naming ``owner.name=value``."""
    embedded = [encoding for encoding in cfg.encodings if REGISTRY[encoding].acts_on_embeddings]
    if embedded:
        fail(owner, name, value, f"needs positions inside attention, which the cache can move; "
             f"pos={cfg.pos!r} adds them to the embeddings, where cached values keep them")
    if cfg.selective_attn:
        fail(owner, name, value, "cannot decode model.selective_attn=True: its F sums over every earlier "
             "query and token, which an eviction that moves tokens would have to move too (prune_threshold "
             "is its own way to drop keys)")


def check_prune_threshold(cfg, owner: str, name: str, value: Any) -> None:
    """Selective attention's context pruning threshold: None (keep every key) or a number >= 0, and only
    for a model with ``selective_attn``. Refused naming ``owner.name=value``."""
    if value is None:
        return
    if not (math.isfinite(as_float(value)) and value >= 0):
        fail(owner, name, value, "must be a number >= 0 (keys whose accumulated selection F passes it are "
             "dropped) or None")
    if not cfg.selective_attn:
        fail(owner, name, value, "needs model.selective_attn=True: context pruning drops the keys selective "
             "attention masked, and this model has none")


class _LayerBuffers:
    """What both caches share: per-layer K and V buffers ``self.k``, ``self.v``, each
    [B, n_kv_head, slots, width]: keys as attention reads them (``PositionalEncoding.key_width``: PoPE's
    are 2 x head_dim) when cached mapped, head_dim when cached before the map; values head_dim. With
    multi-head latent attention, the joint latent [B, 1, slots, mla_kv_rank] and the unrotated shared
    rotary key [B, 1, slots, mla_rope_dim]; with forget gates, ``self.log_gates`` [B, n_head, slots]
    per layer; with selective attention, ``self.selection`` [B, slots] per layer, float32, the column
    sums of its selection matrix over the queries seen (``selective.py``) (none: empty lists). Beside
    them, what a piece carries from one call to the next (``carry``, ``carried``) under its own key."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]
    positions: torch.Tensor | None = None  # [B, capacity]: each token's given position, when given
    log_gates: list[torch.Tensor]
    selection: list[torch.Tensor]
    # What pieces carry to the next call, by their own keys (the newest inputs of a convolution, the
    # newest embedding...): the cache holds them without knowing what they are.
    carried: dict[Hashable, torch.Tensor]

    def _allocate(self, cfg, batch_size: int, slots: list[int], device, dtype: torch.dtype,
                  what: str, mapped_keys: bool) -> None:
        device = torch.device(device) if device is not None else torch.get_default_device()
        self.carried = {}
        if cfg.mla_kv_rank is None:
            key_widths = [REGISTRY[name].key_width(cfg.head_dim) if mapped_keys else cfg.head_dim
                          for name in cfg.layer_pos]
            widths = [((cfg.n_kv_head, key), (cfg.n_kv_head, cfg.head_dim)) for key in key_widths]
        else:
            widths = [((1, cfg.mla_kv_rank), (1, cfg.mla_rope_dim))] * cfg.n_layer
        gate_heads = cfg.n_head if cfg.forget_gate else 0
        sums = 1 if cfg.selective_attn else 0  # F's column sum: one float32 a token
        per_slot = [batch_size * (sum(heads * width for heads, width in layer) * dtype.itemsize
                                  + (gate_heads + sums) * torch.float32.itemsize) for layer in widths]
        check_fits(sum(n * size for n, size in zip(slots, per_slot, strict=True)), device, what)
        self.k = [torch.zeros(batch_size, heads, n, width, device=device, dtype=dtype)
                  for n, ((heads, width), _) in zip(slots, widths, strict=True)]
        self.v = [torch.zeros(batch_size, heads, n, width, device=device, dtype=dtype)
                  for n, (_, (heads, width)) in zip(slots, widths, strict=True)]
        self.log_gates = [torch.zeros(batch_size, gate_heads, n, device=device) for n in slots if gate_heads]
        self.selection = [torch.zeros(batch_size, n, device=device) for n in slots if sums]

    def _layers(self) -> list[tuple[torch.Tensor, ...]]:
        """Each layer's buffers: K, V, its log gates and F's column sums, if any (slots: K's dim 2)."""
        gates = self.log_gates or [None] * len(self.k)
        sums = self.selection or [None] * len(self.k)
        return [tuple(b for b in buffers if b is not None)
                for buffers in zip(self.k, self.v, gates, sums, strict=True)]

    def bytes_per_token(self) -> int:
        """The bytes one cached token takes: a slot of K and V (and the log gates, F's sums) in every
        layer, the whole batch."""
        return sum(sum(b.nbytes for b in buffers) // buffers[0].shape[2] for buffers in self._layers())

    def carry(self, key: Hashable, state: torch.Tensor) -> None:
        """Keep ``state`` under ``key`` for the next call, a copy (a view of a prefill's tensor would keep
        the whole of it alive)."""
        self.carried[key] = state.clone()

    def carried_state(self, key: Hashable) -> torch.Tensor | None:
        """What was kept under ``key`` at the last call; None while the cache holds no token."""
        return self.carried.get(key) if self.length > 0 else None

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for buffers in self._layers() for b in buffers)

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype


class KVCache(_LayerBuffers):
    positions_in_cache = False  # keys are cached rotated at their position in the sequence

    def __init__(self, cfg, batch_size: int, capacity: int, *, device=None, dtype=torch.float32,
                 prune_threshold: float | None = None) -> None:
        """``prune_threshold``: selective attention's context pruning (``selective.py``); None keeps all."""
        check_prune_threshold(cfg, "KVCache", "prune_threshold", prune_threshold)
        self.prune_threshold = prune_threshold
        # Slots per layer: the whole capacity, or a window layer's W - 1 (at least one slot).
        self.slots = [capacity if window is None else max(1, min(capacity, window - 1))
                      for window in cfg.layer_window]
        self.rolling = [window is not None for window in cfg.layer_window]
        self._allocate(cfg, batch_size, self.slots, device, dtype,
                       f"a KV cache for {batch_size} sequence(s) x {capacity} tokens", mapped_keys=True)
        self.capacity = capacity
        self.length = 0  # tokens stored; advanced by the model once every layer has written

    def pruned_tokens(self) -> list[int]:
        """Per layer, the cached tokens (summed over the batch) that context pruning has dropped: those
        whose column sum of F passed ``prune_threshold``. F only grows, so a dropped token stays dropped."""
        if self.prune_threshold is None:
            return [0] * len(self.k)
        return [int((sums[:, :self.length] > self.prune_threshold).sum()) for sums in self.selection]

    def pruned_bytes(self) -> list[int]:
        """Per layer, the bytes of the slots the dropped tokens hold (K, V and F's sums): what a cache
        that compacts them away frees. This cache is allocated for its capacity up front and keeps them."""
        per_token = [sum(b.nbytes for b in buffers) // (buffers[0].shape[0] * buffers[0].shape[2])
                     for buffers in self._layers()]  # one token of one sequence, per layer
        return [count * size for count, size in zip(self.pruned_tokens(), per_token, strict=True)]

    def make_room(self, new_tokens: int) -> None:
        """Called before ``new_tokens`` are encoded: refuses them when they do not fit."""
        if self.length + new_tokens > self.capacity:
            raise ValueError(f"KV cache full: {self.length} cached + {new_tokens} new tokens exceed its "
                             f"capacity of {self.capacity}; size it to prompt + max_new_tokens")

    def place(self, positions: torch.Tensor | None) -> None:
        """Called before new tokens are encoded: keep their given positions [B, T] (None: the default
        ones, from ``length`` on); a sequence cached at one kind of positions refuses the other."""
        if self.length and (positions is None) != (self.positions is None):
            held = "default positions, so the new tokens take them too" if self.positions is None else (
                "given positions, so the new tokens need theirs")
            raise ValueError(f"positions={None if positions is None else list(positions.shape)} is invalid "
                             f"here: the KV cache holds {self.length} tokens at {held}")
        if positions is None:
            return
        if self.positions is None:
            self.positions = torch.zeros(self.k[0].shape[0], self.capacity, dtype=torch.long,
                                         device=self.k[0].device)
        self.positions[:, self.length:self.length + positions.shape[1]] = positions

    def key_positions(self, keys: int, new_tokens: int) -> torch.Tensor:
        """The given positions [B, keys] of the ``keys`` newest keys once ``new_tokens`` are stored."""
        end = self.length + new_tokens
        return self.positions[:, end - keys:end]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, n_kv_head, T, head_dim] after the cached tokens; return the cached ones
        (every one, or a window layer's newest) followed by these, in position order."""
        return self._store(self.k[layer], layer, k), self._store(self.v[layer], layer, v)

    def update_log_gates(self, layer: int, log_gates: torch.Tensor) -> torch.Tensor:
        """``update`` for the forget gates' log f [B, n_head, T]."""
        return self._store(self.log_gates[layer], layer, log_gates)

    def _store(self, buffer: torch.Tensor, layer: int, x: torch.Tensor) -> torch.Tensor:
        """x [B, heads, T, ...] into layer ``layer``'s ``buffer`` (slots in dim 2) after the cached
        tokens -> the cached ones followed by x, in position order."""
        if not self.rolling[layer]:
            end = self.length + x.shape[2]
            buffer[:, :, self.length:end] = x
            return buffer[:, :, :end]  # [B, heads, end, ...]
        slots = self.slots[layer]
        held = min(self.length, slots)  # the newest `held` slots of the buffer are filled
        joined = torch.cat([buffer[:, :, slots - held:], x], dim=2)  # [B, heads, held + T, ...]
        kept = min(joined.shape[2], slots)
        buffer[:, :, slots - kept:] = joined[:, :, -kept:]
        return joined


class StreamingCache(_LayerBuffers):
    """StreamingLLM's cache (Xiao et al. 2023, arXiv:2309.17453): the first ``n_sink`` tokens of the
    stream, which take the attention mass softmax must put somewhere, and the newest ``window``
    tokens; the ones in between are evicted, so a stream of any length decodes in fixed memory.

    Positions are assigned inside the cache, as in the paper: the token in slot c is at position c,
    whatever its place in the stream. Eviction moves tokens to lower slots, so keys are cached
    before the rotation (``positions_in_cache``: attention rotates every cached key at its slot at
    each step). Values and unrotated keys are cached as computed: with more than one layer they
    keep the context they were computed in (the paper's method, not a recomputation).
    """

    positions_in_cache = True

    def __init__(self, cfg, batch_size: int, n_sink: int, window: int, *, device=None,
                 dtype=torch.float32) -> None:
        self.n_sink, self.capacity = n_sink, n_sink + window
        self._allocate(cfg, batch_size, [self.capacity] * cfg.n_layer, device, dtype,
                       f"a streaming KV cache for {batch_size} sequence(s) x {self.capacity} tokens",
                       mapped_keys=False)
        self.length = 0  # tokens held: slots 0 .. length - 1

    def next_piece(self) -> int:
        """How many tokens to feed next, as the paper streams: a cache-full until the cache is
        full, then one at a time (each token then sees exactly the sinks and the window)."""
        return max(1, self.capacity - self.length)

    def place(self, positions: torch.Tensor | None) -> None:
        """Refuses given positions: a token's position here is its slot, which evictions move."""
        if positions is not None:
            raise ValueError(f"positions={list(positions.shape)} is invalid with a streaming cache: its "
                             "tokens are at their slots in the cache, which evictions move")

    def make_room(self, new_tokens: int) -> None:
        """Evict the oldest non-sink tokens so that ``new_tokens`` fit after the rest."""
        room = self.capacity - min(self.length, self.n_sink)
        if new_tokens > room:
            raise ValueError(f"{new_tokens} new tokens do not fit a streaming cache of {self.n_sink} sink + "
                             f"{self.capacity - self.n_sink} window tokens: feed at most {room} at a time")
        evicted = self.length + new_tokens - self.capacity
        if evicted > 0:
            kept = slice(self.n_sink + evicted, self.length)
            for buffer in (*self.k, *self.v, *self.log_gates):
                buffer[:, :, self.n_sink:self.length - evicted] = buffer[:, :, kept].clone()
            self.length -= evicted

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store unrotated k, v [B, n_kv_head, T, head_dim] after the held tokens; return all held."""
        return self._store(self.k[layer], k), self._store(self.v[layer], v)

    def update_log_gates(self, layer: int, log_gates: torch.Tensor) -> torch.Tensor:
        """``update`` for the forget gates' log f [B, n_head, T]: the evicted tokens' gates leave with
        them, so the decay spans the held tokens, as positions do."""
        return self._store(self.log_gates[layer], log_gates)

    def _store(self, buffer: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        end = self.length + x.shape[2]
        buffer[:, :, self.length:end] = x
        return buffer[:, :, :end]  # [B, heads, end, ...]
