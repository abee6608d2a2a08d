"""CoPE (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count What's
Important", arXiv:2405.18719).

Positions are counted by the context instead of by tokens. For query i and key j <= i:

- gate        g_ij = sigmoid(q_i . k_j / sqrt(d)), and g_ij = 0 for a key after its query;
- position    p_ij = sum_{t=j..i} g_it (a reverse cumulative sum over the keys), clipped to
              npos_max - 1, so a head counts only the keys its gates open on (words, sentences, ...);
- logit       z_i[p] = q_i . e[p] for the integer positions p = 0 .. npos_max - 1 (cheap:
              [B, H, Tq, npos_max]), read at the fractional p_ij by linear interpolation between
              z_i[floor p_ij] and z_i[ceil p_ij], and added to the attention logit.

Choices, following the authors' released code (facebookresearch/RAM, projects/cope):
- The embeddings e [npos_max, head_dim] are per layer (one table for each layer in ``layers``)
  and shared by the heads of that layer; each head still counts differently through its own
  q and k.
- The gate scales q.k by 1/sqrt(head_dim), like the attention logit it reuses.
- The position logit is scaled by 1/sqrt(head_dim) as well: the authors add it before dividing
  the logits by sqrt(d) (their default, without ``--cope-nodiv``), i.e. softmax(q.(k + e[p])/sqrt(d))
  as in the paper's formula. Here the caller adds the bias to q.k/sqrt(d), so the bias is z/sqrt(d).
- floor/ceil are integer indices without gradient; the gradient reaches the positions (hence
  the gates, q and k) through the interpolation weight p - floor(p), and none flows where p is
  clipped.
- Initialisation: N(0, init_std) like the repo's learned position table, not the authors'
  zeros. Training from zeros starts as NoPE; a small random table makes the bias non-zero from
  step 0 so the generic tests (cached decoding, chunking) exercise it.

With GQA, query head h gates against kv head h // (n_head // n_kv_head). Every tensor built is at
most [B, n_head, Tq, Tk] for the chunk of queries the attention module asks about, so memory
stays linear in T for a bounded chunk. Cached decoding is exact: the new query's gates run over
the cached keys, which are the same keys recomputation would see.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding
from nanoattn.validation import fail, is_int


class CoPEPositionalEncoding(PositionalEncoding):
    adds_bias = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.npos_max = cfg.cope_npos_max
        self.head_dim = cfg.head_dim
        # One [npos_max, head_dim] table per layer using CoPE, shared by that layer's heads.
        self.embeddings = nn.Parameter(torch.empty(len(self.layers), cfg.cope_npos_max, cfg.head_dim))
        nn.init.normal_(self.embeddings, std=cfg.init_std)

    @classmethod
    def check_config(cls, cfg) -> None:
        if not is_int(cfg.cope_npos_max) or cfg.cope_npos_max < 2:
            fail("model", "cope_npos_max", cfg.cope_npos_max,
                 "must be an integer >= 2 (contextual positions are clipped to cope_npos_max - 1)")

    def contextual_positions(self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor,
                             k_positions: torch.Tensor) -> torch.Tensor:
        """p_ij [B, n_head, Tq, Tk], float32, before clipping (0 for keys after their query)."""
        with torch.autocast(q.device.type, enabled=False):
            return self._positions(q.float() / math.sqrt(self.head_dim), k, q_positions, k_positions)

    @staticmethod
    def _positions(q_scaled, k, q_positions, k_positions) -> torch.Tensor:
        B, H, Tq, D = q_scaled.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        # Query head h = kv * groups + g reads kv head h // groups: the group's queries become rows.
        grouped = q_scaled.reshape(B, Hkv, (H // Hkv) * Tq, D)
        logits = (grouped @ k.float().transpose(-2, -1)).view(B, H, Tq, Tk)  # q.k / sqrt(d)
        future = k_positions[None, :] > q_positions[:, None]  # [Tq, Tk]
        gates = torch.sigmoid(logits).masked_fill(future, 0.0)  # zero BEFORE the sum
        return gates.flip(-1).cumsum(-1).flip(-1)  # p_ij = sum_{t >= j} g_it = sum_{t=j..i} g_it

    def bias(self, q: torch.Tensor, k: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor,
             layer: int) -> torch.Tensor:
        # float32 outside autocast: in bf16 a position near 60 is resolved only to 0.25, coarse
        # for the interpolation it feeds. Both the gate and the position logit are scaled by
        # 1/sqrt(d): scale the (small) queries once.
        with torch.autocast(q.device.type, enabled=False):
            q_scaled = q.float() / math.sqrt(self.head_dim)  # [B, H, Tq, D]
            positions = self._positions(q_scaled, k, q_positions, k_positions).clamp(max=self.npos_max - 1)
            table = self.embeddings[self.layer_slot(layer)].float()  # [npos_max, D]
            z = q_scaled @ table.T  # [B, H, Tq, npos_max]: the logits at the integer positions
            below = positions.detach().long()  # floor, as positions are >= 0; the index has no gradient
            above = (below + 1).clamp_(max=self.npos_max - 1)  # = ceil(p) wherever the weight is > 0
            weight = positions - below  # in [0, 1); the gradient reaches the gates through it
            return torch.lerp(z.gather(-1, below), z.gather(-1, above), weight)  # [B, H, Tq, Tk]
