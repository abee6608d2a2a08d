"""Rotary position embedding (Su et al. 2021, arXiv:2104.09864), half-split layout; partial RoPE; p-RoPE.

Pairs (x_i, x_{i+d/2}) of every query and key are rotated by pos * inv_freq_i, so the
score q_m . k_n depends on m - n only. The half-split ("rotate_half") layout is the one of
LLaMA in transformers and GPT-NeoX; the interleaved GPT-J layout is the same rotation under
a fixed permutation of the q/k projection rows, so weights convert by permuting rows.

Precision: positions come from an int64 arange and the phase, cos and sin are computed in
float32 (elementwise: autocast leaves them so); only the finished cos/sin are cast to the
activations' dtype.
Scaled variants (PI, NTK, dynamic NTK, YaRN, Llama-3) change only ``inv_freq`` and an
attention factor multiplying cos and sin: see ``rope_scaling.py``.

Partial RoPE (``model.rope_fraction``; GPT-NeoX's ``rotary_pct``, transformers'
``partial_rotary_factor``): only the first ``rotary_dim = int(head_dim * rope_fraction)`` dims
of each head rotate. That is transformers' own expression (``dim = int(head_dim *
partial_rotary_factor)`` in the GPT-NeoX / Phi / Phi-3 ``compute_default_rope_parameters`` and
in every scaling of ``modeling_rope_utils``; ``rotary_ndims`` of GPT-NeoX and Phi attention), so
it truncates as they do: int(80 * 0.4) = 32 (Phi-2), int(64 * 0.3) = 19 (refused: must be even).
The half-split layout acts within those dims, pair i being (x_i, x_{i + rotary_dim/2}) for
i < rotary_dim/2, as transformers applies ``rotate_half`` to ``x[..., :rotary_ndims]``; the other
``head_dim - rotary_dim`` dims pass through untouched (no attention factor either: it lives in
cos and sin, which cover the rotary dims only, as in transformers). The frequencies and every
RoPE scaling are computed on the rotary dim, ``rope_frequencies(rotary_dim, ...)``:
inv_freq_i = theta^(-2i / rotary_dim), YaRN's ramp and the NTK base of a rotary_dim model, as
transformers computes them with ``partial_rotary_factor``.

p-RoPE (``model.rope_p``; Barbero et al. 2024, arXiv:2410.06205, "Round and Round We Go! What
makes Rotary Positional Encodings useful?"): keep the fraction p of the highest
frequencies and drop the lowest, whose dims then are not rotated. Of the rotary_dim / 2
frequencies the first ``kept = int(rope_p * rotary_dim // 2)`` (a floor) keep their value and the
rest get inv_freq = 0 (cos = 1, sin = 0). The count and the unchanged exponents are the paper's:
its pseudocode (``apply_p_rope``), like Gemma's ``apply_rope(rope_proportion=...)``
(google-deepmind/gemma, gemma/gm/math/_positional_embeddings.py), computes ``rope_angles =
int(rope_percentage * head_dim // 2)``, keeps timescales theta^(2i / head_dim) for i <
rope_angles (not re-spread over the kept pairs) and pads the rest with an infinite timescale;
transformers' ``proportional`` type is the same. E.g. head_dim 64, p = 0.75: 24 of 32 kept;
p = 0.1: int(6.4 // 2) = 3. A p that keeps no frequency is refused (NoPE is ``pos=nope``).

Combined: ``inv_freq = rope_frequencies(rotary_dim, theta, scaling)`` (partial RoPE, then the
scaling on the rotary dim), then pairs i >= int(rope_p * rotary_dim // 2) are zeroed. So p
counts the rotary dims' frequencies, the scaling sees the whole rotary dim (its ramp and base do
not move with p), and p drops pairs by index: the lowest unscaled frequencies, which are the
lowest scaled ones for every scaling that keeps inv_freq decreasing. A scaling's attention
factor (YaRN) multiplies all rotary dims, the dropped pairs included (cos = factor, sin = 0),
never the dims partial RoPE passes through.
"""

from __future__ import annotations

import torch

from nanoattn.positional.base import PositionalEncoding
from nanoattn.positional.rope_scaling import rope_depends_on_length, rope_frequencies
from nanoattn.validation import as_float, fail


def rotary_dim(head_dim: int, rope_fraction: float) -> int:
    """Dims rotated per head: ``int(head_dim * rope_fraction)``, transformers' partial_rotary_factor rule."""
    return int(head_dim * rope_fraction)


def p_rope_kept(rotary_dim: int, rope_p: float) -> int:
    """Frequencies p-RoPE keeps of rotary_dim // 2: ``int(rope_p * rotary_dim // 2)`` (Barbero et al.)."""
    return int(rope_p * rotary_dim // 2)


class RotaryPositionalEncoding(PositionalEncoding):
    rotary = True
    takes_positions = True

    def __init__(self, cfg, layers, head_dim: int | None = None) -> None:
        """``head_dim``: the width of the queries and keys it rotates, when not the model's (latent
        attention's decoupled rotary dims, ``mla_rope_dim``)."""
        super().__init__(cfg, layers)
        self.head_dim = cfg.head_dim if head_dim is None else head_dim
        self.rotary_dim = rotary_dim(self.head_dim, float(cfg.rope_fraction))
        self.kept = p_rope_kept(self.rotary_dim, float(cfg.rope_p))  # frequencies kept of rotary_dim // 2
        self.theta = float(cfg.rope_theta)
        self.scaling = cfg.rope_scaling
        self.length_dependent_rotation = rope_depends_on_length(cfg.rope_scaling)
        # (device, table length or the dynamic seq_len) -> (cos, sin), each [L, rotary_dim // 2] float32
        self._tables: dict[torch.device, tuple[int, torch.Tensor, torch.Tensor]] = {}
        # (positions, seq_len, dtype, cos, sin) of the last ``rotation``, which the next layer reuses
        self._last_rotation: tuple | None = None
        device = torch.get_default_device()
        if not self.length_dependent_rotation and device.type != "meta":
            self.cos_sin(cfg.max_seq_len, device)  # built now, so a compiled graph reads them

    @classmethod
    def check_config(cls, cfg) -> None:
        fraction, p = as_float(cfg.rope_fraction), as_float(cfg.rope_p)
        if not 0 < fraction <= 1:
            fail("model", "rope_fraction", cfg.rope_fraction,
                 "must be in (0, 1]: the fraction of each head's dims that rotate (1 = all)")
        dim = rotary_dim(cfg.head_dim, fraction)
        if dim == cfg.head_dim and dim % 2:
            raise ValueError(f"model.d_model={cfg.d_model!r} is invalid: rotary positions need an even "
                             f"head_dim, got d_model/n_head={cfg.head_dim}")
        if dim % 2 or dim < 2:
            fail("model", "rope_fraction", cfg.rope_fraction,
                 f"rotates int(head_dim * rope_fraction) = int({cfg.head_dim} * {fraction:g}) = {dim} dims "
                 "of each head; that must be even and >= 2")
        if not 0 < p <= 1:
            fail("model", "rope_p", cfg.rope_p,
                 "must be in (0, 1]: the fraction of rotary frequencies kept, the lowest dropped (1 = all)")
        if p_rope_kept(dim, p) < 1:
            fail("model", "rope_p", cfg.rope_p,
                 f"keeps int(rope_p * rotary_dim // 2) = 0 of the {dim // 2} frequencies; it must be "
                 f">= {2 / dim:g} to keep one (pos=nope rotates nothing)")

    def frequencies(self, seq_len: int | None = None, device: torch.device | str | None = None,
                    ) -> tuple[torch.Tensor, float]:
        """float32 inv_freq [rotary_dim // 2] (p-RoPE's dropped pairs 0) and the attention factor."""
        inv_freq, attention_factor = rope_frequencies(self.rotary_dim, self.theta, self.scaling,
                                                      seq_len=seq_len, device=device)
        if self.kept < inv_freq.shape[0]:
            inv_freq = torch.cat((inv_freq[:self.kept], inv_freq.new_zeros(inv_freq.shape[0] - self.kept)))
        return inv_freq, attention_factor

    def cos_sin(self, seq_len: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin [>= seq_len, rotary_dim // 2], attention factor included.

        Compiled code reads static tables kept before (built at construction, or by an eager call):
        built in its graph, they would fuse into the rotation and be computed again for every head and
        sequence. It never fills the kept tables, nor reads length-dependent ones: a graph that did
        would depend on them, and the next call, or the next length, would compile again."""
        compiling = torch.compiler.is_compiling()
        cached = None if compiling and self.length_dependent_rotation else self._tables.get(device)
        if cached is not None and (cached[0] == seq_len if self.length_dependent_rotation
                                   else cached[0] >= seq_len):
            return cached[1], cached[2]
        # Static tables grow by doubling so decoding does not rebuild them every token.
        length = seq_len if self.length_dependent_rotation else max(seq_len, 2 * (cached[0] if cached else 0))
        inv_freq, attention_factor = self.frequencies(seq_len, device)
        # Elementwise float32, which autocast leaves as it is: no autocast region, whose markers in a
        # compiled graph would keep AOTAutograd from caching it.
        positions = torch.arange(length, dtype=torch.int64, device=device).float()
        phase = positions[:, None] * inv_freq.float()[None, :]  # [L, rotary_dim // 2]
        cos, sin = torch.cos(phase) * attention_factor, torch.sin(phase) * attention_factor
        if not compiling:
            self._tables[device] = (seq_len if self.length_dependent_rotation else length, cos, sin)
        return cos, sin

    def phases(self, positions: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 cos and sin at positions [T] or [B, T] -> [(B,) T, rotary_dim // 2], the attention factor
        included: rows of the table for the default positions; computed at the positions themselves
        for given ones (the same float32 products), so an id far past the others costs what any id
        costs, where a table up to it could need more memory than the machine has."""
        if positions.dim() == 1:
            cos, sin = self.cos_sin(seq_len, positions.device)
            return cos[positions], sin[positions]
        inv_freq, attention_factor = self.frequencies(seq_len, positions.device)
        phase = positions.float()[..., None] * inv_freq.float()  # [B, T, rotary_dim // 2]
        return torch.cos(phase) * attention_factor, torch.sin(phase) * attention_factor

    def rotation_changes(self, old_len: int, new_len: int) -> bool:
        if not self.length_dependent_rotation:
            return False
        (old, old_factor), (new, new_factor) = (self.frequencies(n) for n in (old_len, new_len))
        return old_factor != new_factor or not torch.equal(old, new)

    def rotation(self, positions: torch.Tensor, seq_len: int, dtype: torch.dtype,
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at positions [T] or [B, T], [1 or B, 1, T, rotary_dim] in ``dtype``, each half
        repeated and sin's first half negated, so that x rotates as x cos + roll(x, rotary_dim / 2) sin.

        Every layer rotates at the same positions, so on a CPU the last ones are kept and reused while
        the positions are equal, not rebuilt per layer. On an accelerator comparing them would wait for
        the device, and compiled code fuses the rebuild: there they are rebuilt."""
        compiling = torch.compiler.is_compiling()
        last = None if compiling else self._last_rotation
        if (last is not None and positions.device.type == "cpu"
                and last[1:3] == (seq_len, dtype) and last[0].shape == positions.shape
                and last[0].device == positions.device and torch.equal(last[0], positions)):
            return last[3], last[4]
        cos, sin = self.phases(positions, seq_len)  # float32 [(B,) T, rotary_dim // 2]
        cos = torch.cat((cos, cos), dim=-1).to(dtype).unsqueeze(-3)  # shared by the heads
        sin = torch.cat((-sin, sin), dim=-1).to(dtype).unsqueeze(-3)
        if not compiling:
            self._last_rotation = (positions.clone(), seq_len, dtype, cos, sin)
        return cos, sin

    def rotate(self, x: torch.Tensor, positions: torch.Tensor, seq_len: int) -> torch.Tensor:
        cos, sin = self.rotation(positions, seq_len, x.dtype)
        if self.rotary_dim == self.head_dim:
            # [x1, x2] cos + [x2, x1] [-sin, sin] = [x1 cos - x2 sin, x2 cos + x1 sin], rounded as
            # transformers' q * cos + rotate_half(q) * sin
            return x * cos + x.roll(self.rotary_dim // 2, dims=-1) * sin
        # Partial RoPE: the last head_dim - rotary_dim dims pass through.
        turning, rest = x.split((self.rotary_dim, self.head_dim - self.rotary_dim), dim=-1)
        turned = turning * cos + turning.roll(self.rotary_dim // 2, dims=-1) * sin
        return torch.cat((turned, rest), dim=-1)
