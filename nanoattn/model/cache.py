"""A preallocated KV cache holding n_kv_head heads per layer.

It is sized to what will be decoded (prompt + new tokens), not to the model's maximum: a
cache of the maximum size makes every decoding step attend over empty slots. The next
token's position is the number of tokens already cached. GQA and MQA shrink it by
n_head / n_kv_head, since only the shared K/V heads are stored. Its size is checked against the
device's memory before anything is allocated, so a huge batch or length is a one-line error.
"""

from __future__ import annotations

import math

import torch

from nanoattn.runtime import check_fits


class KVCache:
    def __init__(self, cfg, batch_size: int, capacity: int, *, device=None, dtype=torch.float32) -> None:
        shape = (cfg.n_layer, batch_size, cfg.n_kv_head, capacity, cfg.head_dim)
        device = torch.device(device) if device is not None else torch.get_default_device()
        check_fits(2 * math.prod(shape) * dtype.itemsize, device,  # K and V
                   f"a KV cache for {batch_size} sequence(s) x {capacity} tokens")
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # [L, B, n_kv_head, capacity, head_dim]
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.capacity = capacity
        self.length = 0  # tokens stored; advanced by the model once every layer has written

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def check_room(self, new_tokens: int) -> None:
        if self.length + new_tokens > self.capacity:
            raise ValueError(f"KV cache full: {self.length} cached + {new_tokens} new tokens exceed its "
                             f"capacity of {self.capacity}; size it to prompt + max_new_tokens")

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, n_kv_head, T, head_dim] after the cached tokens; return all of them."""
        end = self.length + k.shape[2]
        self.k[layer, :, :, self.length:end] = k
        self.v[layer, :, :, self.length:end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]  # [B, n_kv_head, end, head_dim]
