"""Rotary position embedding (Su et al. 2021, arXiv:2104.09864), half-split layout.

Pairs (x_i, x_{i+d/2}) of every query and key are rotated by pos * inv_freq_i, so the
score q_m . k_n depends on m - n only. The half-split ("rotate_half") layout is the one of
LLaMA in transformers and GPT-NeoX; the interleaved GPT-J layout is the same rotation under
a fixed permutation of the q/k projection rows, so weights convert by permuting rows.

Precision: positions come from an int64 arange and the phase, cos and sin are computed in
float32 outside autocast; only the finished cos/sin are cast to the activations' dtype.
Scaled variants (PI, NTK, dynamic NTK, YaRN, Llama-3) change only ``inv_freq`` and an
attention factor multiplying cos and sin: see ``rope_scaling.py``.
"""

from __future__ import annotations

import torch

from nanoattn.positional.base import PositionalEncoding
from nanoattn.positional.rope_scaling import rope_depends_on_length, rope_frequencies


class RotaryPositionalEncoding(PositionalEncoding):
    rotary = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.head_dim = cfg.head_dim
        self.theta = float(cfg.rope_theta)
        self.scaling = cfg.rope_scaling
        self.length_dependent_rotation = rope_depends_on_length(cfg.rope_scaling)
        # (device, table length or the dynamic seq_len) -> (cos, sin), each [L, head_dim // 2] float32
        self._tables: dict[torch.device, tuple[int, torch.Tensor, torch.Tensor]] = {}

    @classmethod
    def check_config(cls, cfg) -> None:
        if cfg.head_dim % 2:
            raise ValueError(f"model.d_model={cfg.d_model!r} is invalid: rotary positions need an even "
                             f"head_dim, got d_model/n_head={cfg.head_dim}")

    def cos_sin(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin [>= seq_len, head_dim // 2], attention factor included."""
        cached = self._tables.get(device)
        if cached is not None and (cached[0] == seq_len if self.length_dependent_rotation
                                   else cached[0] >= seq_len):
            return cached[1], cached[2]
        # Static tables grow by doubling so decoding does not rebuild them every token.
        length = seq_len if self.length_dependent_rotation else max(seq_len, 2 * (cached[0] if cached else 0))
        inv_freq, attention_factor = rope_frequencies(self.head_dim, self.theta, self.scaling,
                                                      seq_len=seq_len, device=device)
        with torch.autocast(device_type=device.type, enabled=False):
            positions = torch.arange(length, dtype=torch.int64, device=device).float()
            phase = positions[:, None] * inv_freq.float()[None, :]  # [L, head_dim // 2]
            cos, sin = torch.cos(phase) * attention_factor, torch.sin(phase) * attention_factor
        self._tables[device] = (seq_len if self.length_dependent_rotation else length, cos, sin)
        return cos, sin

    def rotation_changes(self, old_len: int, new_len: int) -> bool:
        if not self.length_dependent_rotation:
            return False
        (old, old_factor), (new, new_factor) = (
            rope_frequencies(self.head_dim, self.theta, self.scaling, seq_len=n) for n in (old_len, new_len))
        return old_factor != new_factor or not torch.equal(old, new)

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        cos, sin = self.cos_sin(seq_len, x.device)
        cos, sin = cos[positions].to(x.dtype), sin[positions].to(x.dtype)  # [T, head_dim // 2]
        x1, x2 = x.chunk(2, dim=-1)  # [B, h, T, head_dim // 2] each
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
