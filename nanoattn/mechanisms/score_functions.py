"""What turns attention scores into weights (``attn_fn``): the score functions' registry.

Design:
- A score function maps the scores s [B, H, Tq, Tk] of one chunk of queries (q.k / sqrt(d), the cap
  and any bias added, -inf where a key is hidden: later, outside the window, or the query itself for
  stick-breaking) to the weights the values are summed with. Each is a small class of
  ``SCORE_FUNCTIONS``, keyed by ``ModelConfig.attn_fn``, and says what it needs of attention:
  ``sdpa`` (SDPA computes it: softmax only; the others take the explicit computation in the same
  query chunks as the bias path, so memory stays linear in T) and ``nearest`` (the offset of the
  nearest key a query weighs: 0, itself; 1 for stick-breaking).
- ``sigmoid`` (Ramapuram et al. 2024, arXiv:2409.04431): A_ij = sigma(s_ij + b), b = -log n, each
  weight on its own (no normalisation over the keys). The paper's n is the sequence length, one
  constant for the whole sequence (its code adds a scalar buffer); here n = ``max_seq_len``, the
  training length, fixed once the model is built (a context extension that sets a longer
  ``max_seq_len`` moves b with it, as the paper's n would). A constant b makes the function
  independent of how many keys a query sees, so causal masking, query chunks and the KV cache give
  the same weights for the same token; a per-query n (the keys visible) would not be the paper's b.
- ``stick_breaking`` (Tan et al. 2025, arXiv:2410.17980): beta_ij = sigma(s_ij) and
  A_ij = beta_ij prod_{j<k<i} (1 - beta_ik) over the keys before the query: each key takes beta of
  the stick the nearer keys left. It is computed in log space, log A_ij = log sigma(s_ij) +
  sum_{k>j} log sigma(-s_ik), the sum a reverse cumulative sum over the keys in float32. A hidden
  key has s = -inf: its log sigma(-s) is 0, so it leaves the stick whole, and its weight is 0.
  The keys are the earlier tokens only (the paper's "each token before the current"; the
  authors' reference code masks the diagonal, flash-linear-attention's ``attend_current=False``);
  the first token has none and its output is 0. The stick left over, 1 - sum_j A_ij, is not added
  to any value (the authors' model code drops it); head analysis reports it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class Softmax:
    """softmax over the keys: the weights sum to 1."""

    sdpa = True
    nearest = 0

    def __init__(self, cfg) -> None:
        pass

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores, dim=-1)


class Sigmoid:
    """sigma(s + b) per key with b = -log(max_seq_len) (module docstring)."""

    sdpa = False
    nearest = 0

    def __init__(self, cfg) -> None:
        self.bias = -math.log(cfg.max_seq_len)

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(scores + self.bias)


class StickBreaking:
    """beta_ij prod_{j<k<i} (1 - beta_ik) in log space, over the keys before the query (module docstring)."""

    sdpa = False
    nearest = 1

    def __init__(self, cfg) -> None:
        pass

    def __call__(self, scores: torch.Tensor) -> torch.Tensor:
        scores = scores.float()  # the sums run over up to a whole row of keys
        left = F.logsigmoid(-scores)  # log(1 - beta): 0 for a hidden key
        # sum over the keys k > j of log(1 - beta_ik): each key's successor onwards, summed from the end.
        after = F.pad(left[..., 1:], (0, 1)).flip(-1).cumsum(-1).flip(-1)
        return torch.exp(F.logsigmoid(scores) + after)


SCORE_FUNCTIONS: dict[str, type] = {"softmax": Softmax, "stick_breaking": StickBreaking, "sigmoid": Sigmoid}
