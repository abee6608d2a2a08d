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
"""

from __future__ import annotations

import torch

from nanoattn.runtime import check_fits


class KVCache:
    def __init__(self, cfg, batch_size: int, capacity: int, *, device=None, dtype=torch.float32) -> None:
        # Slots per layer: the whole capacity, or a window layer's W - 1 (at least one slot).
        self.slots = [capacity if window is None else max(1, min(capacity, window - 1))
                      for window in cfg.layer_window]
        self.rolling = [window is not None for window in cfg.layer_window]
        device = torch.device(device) if device is not None else torch.get_default_device()
        per_slot = batch_size * cfg.n_kv_head * cfg.head_dim * dtype.itemsize
        check_fits(2 * sum(self.slots) * per_slot, device,  # K and V
                   f"a KV cache for {batch_size} sequence(s) x {capacity} tokens")
        self.k = [torch.zeros(batch_size, cfg.n_kv_head, n, cfg.head_dim, device=device, dtype=dtype)
                  for n in self.slots]  # [B, n_kv_head, slots, head_dim] per layer
        self.v = [torch.zeros_like(k) for k in self.k]
        self.capacity = capacity
        self.length = 0  # tokens stored; advanced by the model once every layer has written

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in zip(self.k, self.v, strict=True))

    @property
    def dtype(self) -> torch.dtype:
        return self.k[0].dtype

    def check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(f"KV cache full: {self.length} cached + {new_tokens} new tokens exceed its "
                             f"capacity of {self.capacity}; size it to prompt + max_new_tokens")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, n_kv_head, T, head_dim] after the cached tokens; return the cached ones
        (every one, or a window layer's newest) followed by these, in position order."""
        if not self.rolling[layer]:
            end = self.length + k.shape[2]
            self.k[layer][:, :, self.length:end] = k
            self.v[layer][:, :, self.length:end] = v
            return self.k[layer][:, :, :end], self.v[layer][:, :, :end]  # [B, n_kv_head, end, head_dim]
        slots = self.slots[layer]
        held = min(self.length, slots)  # the newest `held` slots of the buffer are filled
        keys = torch.cat([self.k[layer][:, :, slots - held:], k], dim=2)  # [B, n_kv_head, held + T, head_dim]
        values = torch.cat([self.v[layer][:, :, slots - held:], v], dim=2)
        kept = min(keys.shape[2], slots)
        self.k[layer][:, :, slots - kept:] = keys[:, :, -kept:]
        self.v[layer][:, :, slots - kept:] = values[:, :, -kept:]
        return keys, values
