"""What turns attention scores into weights (``attn_fn``), and the forget gate's decay (``forget_gate``).

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
- ``ForgetGate`` (FoX, Lin et al. 2025, arXiv:2503.02130): per head and token f_t = sigma(w.x_t + b)
  from the block's normalised input; key j's score for query i gets
  D_ij = sum_{t=j+1..i} log f_t = c_i - c_j, c the cumulative sum of log f. The gate is a linear
  layer with a bias, initialised as every linear layer (N(0, init_std) weights, zero bias: f near
  1/2 at the start), as the authors' ``fgate_type="full"`` (their bias initialisation is for their
  data-independent gates; x-transformers starts the bias at 5). The cache keeps each token's
  log f, and c is summed afresh over what it holds, so cached decoding sums the same numbers as
  recomputation; differences c_i - c_j only ever involve the gates between a key and its query,
  which a window's rolling buffer keeps.
- The decay is an additive bias that depends on the content, so the layer hands attention its
  encoding wrapped in ``ForgetDecay``, whose ``bias`` is the encoding's plus D: the bias path
  builds it one chunk of queries at a time ([B, H, chunk, Tk]) with no code of its own.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


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


class ForgetGate(nn.Module):
    """FoX's forget gates of one layer: log f = log sigma(x W^T + b), one per head and token."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.n_head)  # with a bias whatever cfg.bias, as FoX's

    def forward(self, x: torch.Tensor, pos, k_positions: torch.Tensor, cache, layer: int):
        """x [B, T, d_model] (the block's normalised input) -> the encoding ``pos`` wrapped so that its
        bias adds the decay over the keys at k_positions [Tk] (the cached ones first); the cache, if
        any, stores these tokens' log gates."""
        log_gates = F.logsigmoid(self.proj(x).float()).transpose(1, 2)  # [B, H, T]
        if cache is not None:
            log_gates = cache.update_log_gates(layer, log_gates)  # [B, H, Tk]
        return ForgetDecay(pos, log_gates.cumsum(-1), k_positions[0])


class ForgetDecay:
    """An encoding whose bias is its own plus the forget gates' decay D_ij = c_i - c_j, where
    ``cumulative`` [B, H, Tk] holds c of the keys from position ``first`` on. Everything else is
    the encoding's."""

    adds_bias = True

    def __init__(self, encoding, cumulative: torch.Tensor, first: torch.Tensor) -> None:
        self.encoding, self.cumulative, self.first = encoding, cumulative, first

    def __getattr__(self, name: str):
        return getattr(self.encoding, name)

    def bias(self, q, k, q_positions, k_positions, layer):
        """The encoding's bias (or none) plus D for queries at q_positions [Tq] over keys at
        k_positions [Tk]: [B, H, Tq, Tk] float32."""
        c = self.cumulative
        decay = c[:, :, q_positions - self.first, None] - c[:, :, None, k_positions - self.first]
        bias = self.encoding.bias(q, k, q_positions, k_positions, layer)
        return decay if bias is None else bias + decay
