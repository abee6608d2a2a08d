"""Causal self-attention for MHA, GQA and MQA in one module.

Design:
- ``n_kv_head`` query heads share each K/V head (MHA: n_kv_head = n_head, MQA: 1). One fused
  QKV projection is reshaped to heads; this is the same function as per-head projections
  with the matching row slices of the fused weight.
- Which computation runs (SDPA causal, bf16 query blocks, one new token, chunked SDPA with a mask,
  chunked explicit scores) is decided in ``routes.py``: by what SDPA can compute, then by timing,
  with the query chunks a separate, memory decision. The notes below say why each route exists.
- The fast path is ``scaled_dot_product_attention`` with ``enable_gqa`` so K/V are not repeated
  in memory where the kernel supports it. Without a bias and with queries and keys aligned
  it uses ``is_causal`` (flash / memory-efficient kernels, memory linear in T).
- On CPU in bf16 with up to ``BF16_MATMUL_MAX_KEYS`` keys (``attn_kernel='auto'``, the default),
  the same function is computed as two bf16 matmuls around a softmax wherever they are timed
  faster than SDPA's CPU flash kernel on this machine (``_attend_explicit`` in bf16; the score cap
  and sinks too, whose explicit scores are otherwise float32). Causal attention takes its queries
  in blocks (``kernels.causal_query_blocks``), each over only the keys it sees. ``python
  scripts/bench.py 'only=[attention]'`` prices both. The scores are then at most [B, H, T, 1024]
  (a block's [B, H, 64, <= 1024]): memory stays linear in T. ``attn_kernel='sdpa'`` takes SDPA
  wherever it can compute the variant.
- An additive bias (ALiBi) or a cached prefix needs an explicit mask. Queries are then
  processed in chunks, so the largest bias ever built is [n_head, chunk, T_k], never
  [n_head, T, T] for long inputs; each chunk attends only to the keys up to its last query,
  which halves the work of a long causal input. Past ``CAUSAL_QUERY_BLOCK`` queries a chunk
  is at most that many, as in the blocks above, which skip most of the masked triangle.
- The slow path (``return_weights=True``) computes softmax(QK^T/sqrt(d) + bias) explicitly and
  returns the weights for analysis; tests check it equals the fast path.
- Variants not yet in ``nanoattn.mechanisms`` are small named pieces: learned sinks (one logit per
  head joins every softmax and takes mass without a value: gpt-oss) and a sliding window (a query
  sees itself and the ``window - 1`` keys before it). SDPA cannot add a column without a value, so
  sinks take the explicit computation in the same query chunks as the bias path, as does every
  mechanism that acts on the scores: memory stays linear in T. A windowed layer's chunks start at
  their first query's window, so its work is O(T * window), and its KV cache rolls (``cache.py``).
  Differential attention is two passes of the same attention, one per half
  of each head pair, whose outputs are subtracted (``_differential``).
- What turns the scores into weights is the layer's score function (``attn_fn``: softmax, sigmoid,
  stick-breaking; ``mechanisms/score_functions.py``), asked what it needs: SDPA computes only the
  softmax, so the others take the explicit computation in query chunks, and stick-breaking's queries
  weigh only earlier keys (``nearest``). FoX's forget gate (``forget_gate``) adds a decay that depends on the
  content to the scores: the layer wraps its encoding so that the decay joins the encoding's bias,
  computed on the bias path in query chunks, and the cache keeps the gates.
- Value embeddings (modded-nanogpt): a layer given a token table's rows (``GPT`` looks them up)
  mixes them into its new values, v = a v + b e[token] with learned (a, b), before the cache
  stores them, so cached decoding stays exact.
- The mechanisms of ``nanoattn.mechanisms`` (Scalable-Softmax, talking heads, exclusive
  self-attention, the output norm and gate...) are asked what they do, never named: each layer
  builds the ones its config uses and calls their hooks in registry order, on the queries after the
  encoding, on the scores and on the weights (those with ``sdpa_computes`` False, which take the
  explicit computation in query chunks), and on the heads' outputs before ``head_mask`` and W_O.
- The positional encoding is the layer's own (``GPT`` hands it ``pos.for_layer(layer)``) and is
  asked for what it does (``rotate``, ``scale_queries``, ``scale_keys``, ``bias``); this module
  never branches on its name. Selective attention's F is an additive bias that stands in for the
  encoding (``selective.py``). Positions are [T] (consecutive, the default) or given per token,
  [B, T], whose keys' positions the KV cache keeps (``key_positions``). The causal mask is by token
  order, never by position: given positions may repeat or go back (position coupling).
"""

from __future__ import annotations

import abc
import math

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.kernels import (
    Linear,
    bf16_matmuls_faster,
    causal_query_blocks,
    grouped_scores,
    grouped_values,
)
from nanoattn.mechanisms import used_mechanisms
from nanoattn.mechanisms.score_functions import SCORE_FUNCTIONS
from nanoattn.model import routes
from nanoattn.model.cache import KVCache, StreamingCache
from nanoattn.model.forget_gate import ForgetGate
from nanoattn.model.gates import KVShift
from nanoattn.model.layers import dropout
from nanoattn.model.selective import SelectiveBias
from nanoattn.positional.base import PositionalEncoding

# attn_kernel='auto' on CPU in bf16: up to this many keys, two bf16 matmuls and a softmax are timed
# against SDPA's flash kernel (``CausalAttention._scores_in_bf16``); past it their [B, H, Tq, keys]
# scores grow quadratically while the flash kernel's memory stays linear, so SDPA is taken.
BF16_MATMUL_MAX_KEYS = 1024


def key_positions(positions: torch.Tensor, seq_len: int, keys: int,
                  cache: KVCache | StreamingCache | None) -> torch.Tensor:
    """Positions of the ``keys`` newest keys, the cached ones first, for queries at ``positions``:
    [keys] consecutive up to seq_len - 1 for the default positions [T]; for given ones [B, T], the
    queries' own without a cache, else the positions the cache holds for its keys [B, keys]."""
    if positions.dim() == 1:
        return torch.arange(seq_len - keys, seq_len, device=positions.device)
    return positions if cache is None else cache.key_positions(keys, positions.shape[1])


class CausalAttention(nn.Module, abc.ABC):
    """The part every attention shares: causal softmax(q.k / sqrt(d)) v over heads [B, H, T, D] (or
    the layer's other score function), with the encoding's bias, the forget gates' decay, the window,
    the mechanisms' hooks and the sinks, in query chunks
    (``_attend``) or explicitly with the weights (``_attend_explicit``). Subclasses make q, k, v
    (``_qkv``), caching what they cache."""

    def __init__(self, cfg, layer: int) -> None:
        super().__init__()
        self.dropout = cfg.dropout
        # gpt-oss's sinks, from zero: one extra key of score 0 (transformers draws them N(0, 0.02)).
        self.sinks = nn.Parameter(torch.zeros(cfg.n_head)) if cfg.attn_sinks else None
        self.score_fn = SCORE_FUNCTIONS[cfg.attn_fn](cfg)  # scores -> weights
        self.forget_gate = ForgetGate(cfg) if cfg.forget_gate else None
        # Each under the attribute it declares (its checkpoint names); hooks run in registry order.
        self.mechanisms = [mechanism(cfg, layer) for mechanism in used_mechanisms(cfg).values()]
        for mechanism in self.mechanisms:
            self.add_module(mechanism.attribute, mechanism)
        # Only the hooks a mechanism overrides run: a decoding step pays for no identity.
        self.query_hooks = [m for m in self.mechanisms if m.overrides("queries")]
        self.score_hooks = [m for m in self.mechanisms if not m.sdpa_computes]
        self.head_hooks = [m for m in self.mechanisms if m.overrides("heads")]
        # SDPA computes none of these: a cap, a sink column, weights other than a softmax, a mechanism's
        # change to the scores or the weights.
        self.explicit = self.sinks is not None or not self.score_fn.sdpa or bool(self.score_hooks)
        self.window = cfg.layer_window[layer]  # None: every earlier key
        self.kernel = cfg.attn_kernel
        self.selective = cfg.selective_attn
        # When a tensor (GPT.max_attention_logit sets it), attention runs explicitly in query chunks
        # and keeps the largest |q.k| / sqrt(d) of a visible key here, before any cap.
        self.largest_logit: torch.Tensor | None = None

    def forward(
        self,
        x: torch.Tensor,
        pos: PositionalEncoding,
        positions: torch.Tensor,
        seq_len: int,
        *,
        cache: KVCache | StreamingCache | None = None,
        layer: int = 0,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
        value_embed: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x [B, T, d_model] at positions [T] = seq_len - T, ..., seq_len - 1, or given ones [B, T] below
        seq_len -> [B, T, d_model].

        Also returns the attention weights [B, heads, T, T_k] when ``return_weights`` (slow path).
        """
        q, k, v, k_positions = self._qkv(x, pos, positions, seq_len, cache, layer, value_embed)
        for mechanism in self.query_hooks:
            q = mechanism.queries(q, positions)
        if self.forget_gate is not None:  # the gates' decay joins the encoding's bias
            pos = self.forget_gate(x, pos, k_positions, cache, layer)
        if self.selective:  # F joins the encoding's bias (selective.py)
            pos = SelectiveBias.start(pos, q, k, self.transform_scores, cache, layer)
        y, weights = self.attend_heads(q, k, v, positions, k_positions, pos, layer, return_weights)
        own_values = v[:, :, -x.shape[1]:]  # the new tokens' own values, the newest
        for mechanism in self.head_hooks:
            y = mechanism.heads(x, y, own_values)
        return self._project(y, head_mask), weights

    @abc.abstractmethod
    def _qkv(self, x, pos, positions, seq_len, cache, layer, value_embed):
        """-> q [B, H, T, Dq], k [B, Hkv, T_k, Dq], v [B, Hkv, T_k, Dv] in one dtype, and the keys'
        positions [T_k] or [B, T_k] (the cached ones first, ``key_positions``). ``value_embed``
        [B, T, Hkv * Dv] or None: the value-embedding rows of this layer's tokens (ModelConfig allows
        them only with ``Attention``)."""

    def attend_heads(self, q, k, v, q_positions, k_positions, pos, layer, return_weights=False):
        """The layer's attention over given heads: q [B, H, Tq, D] at ``q_positions`` over k
        [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] at ``k_positions``, the newest Tq keys the queries' own,
        with the encoding ``pos`` of layer ``layer`` -> (y [B, H, Tq, Dv], None) by the fast route
        (``routes``), or (y, the weights [B, H, Tq, Tk]) computed explicitly when ``return_weights``."""
        if return_weights:
            mask = self._mask(q, k, q_positions, k_positions, pos, layer, torch.float32)
            return self._attend_explicit(q, k, v, mask)
        return self._attend(q, k, v, q_positions, k_positions, pos, layer), None

    def _project(self, y: torch.Tensor, head_mask: torch.Tensor | None) -> torch.Tensor:
        """Heads y [B, heads, T, Dv], each scaled by ``head_mask`` [heads], concatenated and
        projected by ``self.proj`` -> [B, T, d_model]."""
        if head_mask is not None:
            y = y * head_mask.to(y.dtype).view(1, -1, 1, 1)
        B, _, T, _ = y.shape
        return dropout(self.proj(y.transpose(1, 2).reshape(B, T, -1)), self.dropout, self.training)

    def _attend(self, q, k, v, q_positions, k_positions, pos, layer) -> torch.Tensor:
        """Fast path. q [B, H, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv] -> [B, H, Tq, Dv], by the
        route ``routes.choose_route`` picks."""
        B, H, Tq, D = q.shape
        Hkv, Tk, Dv = k.shape[1], k.shape[2], v.shape[3]
        options = dict(enable_gqa=Hkv != H, dropout_p=self.dropout if self.training else 0.0)
        explicit = self.explicit or self.largest_logit is not None
        # SDPA's fused kernels need values as wide as queries (differential attention's are twice):
        # otherwise its math kernel would build the whole [B, H, Tq, Tk], so those go in chunks too.
        fused = not pos.adds_bias and not explicit and Dv == D and (self.window is None or Tk <= self.window)
        route = routes.choose_route(fused=fused, explicit=explicit, queries=Tq, keys=Tk,
                             bf16_faster=lambda keys: self._scores_in_bf16(q, k, keys))
        if route == "bf16_blocks":
            return causal_query_blocks(q, k, v, lambda *b: self._attend_explicit(*b, q.dtype)[0])
        if route == "sdpa_causal":
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, **options)
        if route == "sdpa_one_token":
            # Each group's query heads become the query rows of its K/V head: no mask, no repeated
            # K/V, and at batch 1 a third of the time of SDPA's enable_gqa path.
            y = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v,
                                               dropout_p=options["dropout_p"])  # [B, Hkv, H / Hkv, Dv]
            return y.view(B, H, 1, Dv)
        outputs = []
        for start, stop, first, last in routes.query_chunks(B, H, Tq, Tk, self.window):
            q_chunk, k_chunk, v_chunk = q[:, :, start:stop], k[:, :, first:last], v[:, :, first:last]
            # bf16 scores where the matmuls beat SDPA, the score cap and sinks included; float32 ones
            # for the other explicit computations and for the largest logit, a measurement.
            bf16 = self.largest_logit is None and self._scores_in_bf16(q, k, last - first)
            q_at, k_at = q_positions[..., start:stop], k_positions[..., first:last]  # [(B,) Tq'], [(B,) Tk']
            mask = self._mask(q_chunk, k_chunk, q_at, k_at, pos, layer,
                              torch.float32 if explicit and not bf16 else q.dtype)
            if explicit or bf16:
                scores_dtype = q.dtype if bf16 else torch.float32
                outputs.append(self._attend_explicit(q_chunk, k_chunk, v_chunk, mask, scores_dtype)[0])
            else:
                outputs.append(F.scaled_dot_product_attention(q_chunk, k_chunk, v_chunk, attn_mask=mask,
                                                              **options))
        return torch.cat(outputs, dim=2)

    def _scores_in_bf16(self, q: torch.Tensor, k: torch.Tensor, keys: int) -> bool:
        """Whether to attend with two bf16 matmuls and a softmax instead of SDPA (``attn_kernel='auto'``):
        on CPU in bf16 with up to ``BF16_MATMUL_MAX_KEYS`` keys, where they are faster here, timed
        once per shape by ``kernels.bf16_matmuls_faster``."""
        if not (self.kernel == "auto" and q.device.type == "cpu" and q.dtype == torch.bfloat16
                and keys <= BF16_MATMUL_MAX_KEYS):
            return False
        B, H, _, D = q.shape
        return bf16_matmuls_faster(B, H, k.shape[1], D, keys, torch.is_grad_enabled())

    def _mask(self, q, k, q_positions, k_positions, pos, layer, dtype) -> torch.Tensor:
        """Causal (and window) mask plus the encoding's bias: bool [Tq, Tk] or additive [(B,) H, Tq, Tk].

        The queries are the newest Tq of the Tk tokens the keys stand for (every caller's chunks end
        at their last query's key): the mask follows token order, the bias the positions."""
        Tq, Tk = q.shape[2], k.shape[2]
        order = torch.arange(Tk, device=q.device)
        offset = order[Tk - Tq:, None] - order[None, :]  # [Tq, Tk]: how many tokens back each key is
        nearest = self.score_fn.nearest  # 0: a query weighs its own key too
        allowed = offset >= nearest if self.window is None else (offset >= nearest) & (offset < self.window)
        bias = pos.bias(q, k, q_positions, k_positions, layer)
        if bias is None:
            return allowed
        return bias.masked_fill(~allowed, float("-inf")).to(dtype)

    def transform_scores(self, scores: torch.Tensor) -> torch.Tensor:
        """What the layer's mechanisms make of the scores q.k / sqrt(d) [B, H, Tq, Tk] before the
        encoding's bias and the mask (the score cap, talking heads' mix...): their ``scores`` hooks in
        registry order."""
        for mechanism in self.score_hooks:
            scores = mechanism.scores(scores)
        return scores

    def _attend_explicit(self, q, k, v, mask, dtype=torch.float32):
        """score_fn(transform_scores(q.k / sqrt(D)) + mask) @ v with the scores in ``dtype``, the
        mechanisms' ``weights`` hooks after the score function, returning the weights [B, H, Tq, Tk] as
        well.

        The products are grouped by K/V head (``kernels.grouped_scores``), so K/V are never repeated.
        With sinks, each head's sink logit is one more column of the softmax, dropped after it: the
        weights then sum to 1 - the sink's mass.
        """
        B, H, Tq, _ = q.shape
        scores = grouped_scores(q, k).to(dtype)  # [B, H, Tq, Tk]
        if self.largest_logit is not None:
            visible = mask if mask.dtype == torch.bool else mask > float("-inf")
            largest = scores.abs().masked_fill(~visible, 0).amax()
            self.largest_logit = torch.maximum(self.largest_logit, largest)
        scores = self.transform_scores(scores)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        if self.sinks is None:
            weights = self.score_fn(scores)
        else:
            sinks = self.sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, Tq, 1)
            weights = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
        for mechanism in self.score_hooks:
            weights = mechanism.weights(weights)
        kept = dropout(weights, self.dropout, self.training).to(v.dtype)
        return grouped_values(kept, v), weights


class Attention(CausalAttention):
    """Fused-QKV attention for MHA, GQA and MQA, with differential attention; it calls the mechanisms'
    hooks on the projected queries and keys (``before_rotation``, ``after_rotation``)."""

    def __init__(self, cfg, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        kv_width = cfg.n_kv_head * cfg.head_dim
        self.qkv = Linear(cfg.d_model, cfg.d_model + 2 * kv_width, bias=cfg.bias)
        self.proj = Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.projection_hooks = [m for m in self.mechanisms if m.acts_on_projections()]
        # Value embeddings' (a, b) in v = a v + b e[token], from modded-nanogpt's (0.5, 0.5).
        fed = cfg.layer_value_embed[layer] is not None
        self.value_mix = nn.Parameter(torch.full((2,), 0.5)) if fed else None
        self.kv_shift = KVShift(cfg, layer) if cfg.kv_shift else None
        self.differential = cfg.diff_attn
        if self.differential:
            # Ye et al. 2024: lambda = exp(lq1 . lk1) - exp(lq2 . lk2) + lambda_init, vectors drawn
            # N(0, 0.1), lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)) for layer l = 1..L; each head's
            # output normalised over its 2 * head_dim values and scaled by 1 - lambda_init.
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.randn(cfg.head_dim) * 0.1) for _ in range(4))
            self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * layer)
            self.head_norm = nn.RMSNorm(2 * cfg.head_dim, eps=cfg.norm_eps)

    def _qkv(self, x, pos, positions, seq_len, cache, layer, value_embed):
        B, T, _ = x.shape
        H, Hkv, D = self.n_head, self.n_kv_head, self.head_dim
        heads = self.qkv(x).view(B, T, H + 2 * Hkv, D).transpose(1, 2)  # [B, H + 2 Hkv, T, D]: q | k | v
        # split_with_sizes, not split: Tensor.split's Python wrapper is paid per layer and token in decoding
        qk, v = heads.split_with_sizes([H + Hkv, Hkv], dim=1)  # v: [B, Hkv, T, D]
        if self.kv_shift is not None:
            q, k = qk.split_with_sizes([H, Hkv], dim=1)
            k, v = self.kv_shift(x, k, v, cache)
            qk = torch.cat([q, k], dim=1)
        if value_embed is not None:
            mix = self.value_mix.to(v.dtype)
            v = mix[0] * v + mix[1] * value_embed.to(v.dtype).view(B, T, Hkv, D).transpose(1, 2)
        if self.projection_hooks:
            q, k = qk.split_with_sizes([H, Hkv], dim=1)
            for mechanism in self.projection_hooks:
                q, k = mechanism.before_rotation(q, k)
            qk = torch.cat([q, k], dim=1)
        if cache is not None and cache.positions_in_cache:
            # StreamingLLM: keys are cached unrotated and placed at their cache slot at every step,
            # since evictions move them; positions (and seq_len) are slots in the cache.
            q, k = qk.split_with_sizes([H, Hkv], dim=1)
            k, v = cache.update(layer, k, v)  # [B, Hkv, seq_len, D], slots 0 .. seq_len - 1
            k_positions = torch.arange(seq_len - k.shape[2], seq_len, device=x.device)
            q, k = pos.rotate(q, positions, seq_len), pos.rotate(k, k_positions, seq_len)
            for mechanism in self.projection_hooks:
                q, k = mechanism.after_rotation(q, k)
            q, k = pos.scale_queries(q, positions), pos.scale_keys(k, k_positions)
        else:
            # Queries and keys rotate in one call: one cos/sin lookup, half the kernel launches.
            qk = pos.rotate(qk, positions, seq_len)
            q, k = qk.split_with_sizes([H, Hkv], dim=1)  # [B, H, T, D], [B, Hkv, T, D]
            for mechanism in self.projection_hooks:
                q, k = mechanism.after_rotation(q, k)
            q, k = pos.scale_queries(q, positions), pos.scale_keys(k, positions)
            if cache is not None:
                k, v = cache.update(layer, k, v)  # [B, Hkv, T_k, D]
            k_positions = key_positions(positions, seq_len, k.shape[2], cache)
        return q, k.to(q.dtype), v.to(q.dtype), k_positions

    def attend_heads(self, q, k, v, q_positions, k_positions, pos, layer, return_weights=False):
        if self.differential:
            return self._differential(q, k, v, q_positions, k_positions, pos, layer, return_weights)
        return super().attend_heads(q, k, v, q_positions, k_positions, pos, layer, return_weights)

    def _differential(self, q, k, v, q_positions, k_positions, pos, layer, return_weights):
        """Differential attention (Ye et al. 2024, arXiv:2410.05258): query heads (2i, 2i + 1) and
        key heads (2j, 2j + 1) are pairs; each half gives a softmax map, A1 from the first heads and
        A2 from the second, and pair i's output is RMSNorm((A1 - lambda A2) V) (1 - lambda_init),
        with V the values of heads 2j and 2j + 1 side by side. q [B, H, Tq, D], k/v [B, Hkv, Tk, D]
        -> [B, H / 2, Tq, 2D], and the maps (A1 - lambda A2) / (1 - lambda) when asked: the norm
        ignores the scale, and so each row sums to 1 like a softmax's."""
        B, Hkv, Tk, D = v.shape
        values = v.view(B, Hkv // 2, 2, Tk, D).transpose(2, 3).reshape(B, Hkv // 2, Tk, 2 * D)
        # Products and sums, not matmuls: autocast would round these dot products to bfloat16.
        first = torch.exp((self.lambda_q1 * self.lambda_k1).sum())
        second = torch.exp((self.lambda_q2 * self.lambda_k2).sum())
        lam = (first - second + self.lambda_init).to(q.dtype)
        outputs, maps = [], []
        for half in (0, 1):
            y, weights = super().attend_heads(q[:, half::2], k[:, half::2], values, q_positions, k_positions,
                                              pos, layer, return_weights)
            outputs.append(y)
            maps.append(weights)
        # In the norm's dtype, as QK-norm's: torch's fused RMSNorm refuses bf16 input with float32 weights.
        mixed = (outputs[0] - lam * outputs[1]).to(self.head_norm.weight.dtype)
        y = self.head_norm(mixed) * (1 - self.lambda_init)
        weights = (maps[0] - lam.float() * maps[1]) / (1 - lam.float()) if return_weights else None
        return y.to(q.dtype), weights
