"""T5 relative position bias (Raffel et al. 2020, "Exploring the Limits of Transfer Learning with
a Unified Text-to-Text Transformer", arXiv:1910.10683, section 2.1).

No position enters the embeddings; each head adds a learned scalar to its attention logits,
one per bucket of the distance d = query_pos - key_pos >= 0 (causal: one direction only):

- the first n // 2 buckets (n = ``t5_num_buckets``) are exact: distances 0 .. n // 2 - 1;
- the rest are log-spaced from n // 2 up to ``t5_max_distance``:
  bucket(d) = n // 2 + floor(log(d / (n // 2)) / log(max_distance / (n // 2)) * (n - n // 2)),
  and every distance from max_distance on shares the last bucket n - 1.
This is transformers' ``T5Attention._relative_position_bucket(bidirectional=False)``, computed in
the same float32 operations (tested bucket for bucket), i.e. Mesh TensorFlow's decoder buckets.

Choices:
- One table [num_buckets, n_head] shared by every layer that uses it, as in T5 (``layer`` is
  ignored). It is an ``nn.Embedding``, like T5's ``relative_attention_bias``, so the optimizer
  treats it as an embedding (not decayed unless ``decay_embeddings``).
- Initialisation: small normal N(0, init_std), the repo's rule for every table (token
  embeddings, learned positions, CoPE) and the model re-initialises embeddings so anyway;
  transformers' T5 also initialises the table normal. Zeros would work too (the table's
  gradient is non-zero from step 0, each head's through its own q.k), but would start as NoPE
  and leave the generic tests (cached decoding, chunking) with a zero bias to check.
- A chunk computes the buckets of its own distances ([(B,) Tq, Tk]) and gathers the table at them:
  nothing is sized by ``t5_max_distance``, which may be any integer. Distances past it are all in
  the last bucket, so the bias is defined at any length.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nanoattn.positional.base import PositionalEncoding
from nanoattn.validation import fail, is_int


def t5_causal_bucket(distance: torch.Tensor, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bucket [...] (int64) of integer distances [...] = query_pos - key_pos (negatives count as 0)."""
    distance = distance.clamp(min=0)
    exact = num_buckets // 2
    # Log-spaced buckets past the exact ones, in float32 as transformers computes them (clamped
    # to >= 1 only so that log never sees 0: those distances take the exact branch anyway).
    scaled = torch.log(distance.clamp(min=1).float() / exact) / math.log(max_distance / exact)
    log_bucket = exact + (scaled * (num_buckets - exact)).to(torch.long)
    return torch.where(distance < exact, distance, log_bucket.clamp(max=num_buckets - 1))


class T5PositionalEncoding(PositionalEncoding):
    adds_bias = True
    takes_positions = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.num_buckets, self.max_distance = cfg.t5_num_buckets, cfg.t5_max_distance
        self.table = nn.Embedding(cfg.t5_num_buckets, cfg.n_head)  # [num_buckets, n_head]
        nn.init.normal_(self.table.weight, std=cfg.init_std)

    @classmethod
    def check_config(cls, cfg) -> None:
        if not is_int(cfg.t5_num_buckets) or cfg.t5_num_buckets < 2:
            fail("model", "t5_num_buckets", cfg.t5_num_buckets,
                 "must be an integer >= 2 (half exact distance buckets, half log-spaced)")
        exact = cfg.t5_num_buckets // 2
        if not is_int(cfg.t5_max_distance) or cfg.t5_max_distance <= exact:
            fail("model", "t5_max_distance", cfg.t5_max_distance,
                 f"must be an integer > t5_num_buckets // 2 = {exact} (the log-spaced buckets span "
                 f"the distances from {exact} to t5_max_distance)")

    def bias(self, q, k, q_positions: torch.Tensor, k_positions: torch.Tensor, layer: int) -> torch.Tensor:
        distance = q_positions[..., :, None] - k_positions[..., None, :]  # [(B,) Tq, Tk]
        bucket = t5_causal_bucket(distance, self.num_buckets, self.max_distance)  # [(B,) Tq, Tk]
        by_bucket = self.table.weight.float().T  # [n_head, num_buckets]
        # index_select, not by_bucket[:, bucket]: several times faster, forward and backward.
        bias = by_bucket.index_select(1, bucket.reshape(-1)).view(-1, *bucket.shape)
        return bias.movedim(0, -3)  # [n_head, (B,) Tq, Tk] -> [(B,) n_head, Tq, Tk]
