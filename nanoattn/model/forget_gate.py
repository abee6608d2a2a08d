"""FoX's forget gate (``forget_gate``), whose decay joins the scores as a bias.

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

import torch
import torch.nn.functional as F
from torch import nn


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
