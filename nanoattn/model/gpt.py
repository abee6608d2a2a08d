"""A decoder-only GPT: token embedding, pre-norm blocks, final norm, LM head.

Where position enters is the positional encoding's business (see ``positional/base.py``);
this file only hands it explicit positions: 0..T-1 (after what a cache holds) unless the caller
gives each token its own, ``positions`` [B, T], which an encoding that cannot take them refuses
(``ModelConfig.positions_refusal``). Initialisation follows GPT-2: N(0, init_std)
for weights, zero biases, and residual output projections scaled by 1/sqrt(2 * n_layer)
so the residual stream's variance does not grow with depth.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from nanoattn.config import ModelConfig
from nanoattn.kernels import Linear
from nanoattn.mechanisms.score_cap import softcap
from nanoattn.model.abacus import Abacus
from nanoattn.model.attention import Attention
from nanoattn.model.cache import KVCache, StreamingCache
from nanoattn.model.gates import Canon
from nanoattn.model.latent import LatentAttention
from nanoattn.model.layers import dropout, make_mlp, make_norm
from nanoattn.positional import build_positional

# Largest float32 logits block [rows, vocab_size] that GPT.loss builds at once without autograd.
LOSS_CHUNK_ELEMENTS = 1 << 22
# A target that GPT.loss skips (F.cross_entropy's default): no loss, no gradient, not counted.
IGNORE_INDEX = -100


def shift_tokens(x: torch.Tensor, gate: torch.Tensor, first: torch.Tensor | None = None) -> torch.Tensor:
    """x_t + gate * x_{t-1} over x [B, T, D] (``model.token_shift``); x_{-1} is ``first`` [B, 1, D], or 0."""
    previous = F.pad(x[:, :-1], (0, 0, 1, 0)) if first is None else torch.cat([first, x[:, :-1]], dim=1)
    return x + gate * previous


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = make_norm(cfg)
        self.canon = Canon(cfg, layer) if cfg.canon else None  # Canon-A, on the attention's input
        self.attn = Attention(cfg, layer) if cfg.mla_kv_rank is None else LatentAttention(cfg, layer)
        self.mlp_norm = make_norm(cfg)
        self.mlp = make_mlp(cfg)
        self.dropout = cfg.dropout

    def forward(self, x, pos, positions, seq_len, **attn_options):
        h = self.attn_norm(x)
        if self.canon is not None:
            h = self.canon(h, attn_options.get("cache"))
        a, weights = self.attn(h, pos, positions, seq_len, **attn_options)
        x = x + a
        x = x + dropout(self.mlp(self.mlp_norm(x)), self.dropout, self.training)
        return x, weights


class GPT(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.shift_gate = nn.Parameter(torch.zeros(cfg.d_model)) if cfg.token_shift else None
        self.value_emb = nn.ModuleList(nn.Embedding(cfg.vocab_size, cfg.n_kv_head * cfg.head_dim)
                                       for _ in range(cfg.value_embeds))
        self.pos = build_positional(cfg)
        self.abacus = Abacus(cfg) if cfg.abacus else None  # McLeish et al.'s digit indices, beside any pos
        self.positions_refusal = cfg.positions_refusal  # why given positions are refused; None: taken
        self.blocks = nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layer))
        self.norm = make_norm(cfg)
        self.lm_head = Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.tok_emb.weight
        self.apply(self._init_weights)
        self.pos.reset_parameters()  # an encoding's own rule for its parameters, if it has one
        residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layer)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            nn.init.normal_(block.mlp.down.weight, std=residual_std)

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.init_std)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def hidden_states(
        self,
        idx: torch.Tensor,
        positions: torch.Tensor | None = None,
        *,
        cache: KVCache | StreamingCache | None = None,
        head_mask: torch.Tensor | None = None,
        return_weights: bool = False,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """idx [B, T] -> (final-normed hidden states [B, T, d_model], per-layer attention weights).

        With a cache, idx continues the cached tokens: its positions start at ``cache.length``, unless
        given: ``positions`` [B, T] int64, each token's own (see ``positional/base.py``).
        ``head_mask`` [n_layer, attention_heads] multiplies each head's output (0 removes the head;
        attention_heads is n_head, or n_head / 2 with differential attention).
        """
        B, T = idx.shape
        if cache is not None:
            cache.make_room(T)  # a streaming cache evicts here: the new tokens start after what it holds
        start = 0 if cache is None else cache.length
        if positions is None:
            seq_len = start + T
            self.pos.check_length(seq_len)
        else:
            seq_len = self.check_positions(positions, idx.shape)
        if cache is not None:
            cache.place(positions)
        if positions is None:
            positions = torch.arange(start, seq_len, device=idx.device)  # [T]
        x = self.tok_emb(idx)  # [B, T, d_model]
        if self.shift_gate is not None:
            x = self._shift_tokens(x, cache)
        x = self.pos.embed(x, positions)
        if self.abacus is not None:
            x = x + self.abacus(idx, cache).to(x.dtype)
        x = dropout(x, self.cfg.dropout, self.training)
        value_embeds = [table(idx) for table in self.value_emb]  # [B, T, n_kv_head * head_dim] each
        all_weights = []
        for layer, (block, table) in enumerate(zip(self.blocks, self.cfg.layer_value_embed, strict=True)):
            x, weights = block(x, self.pos.for_layer(layer), positions, seq_len, cache=cache, layer=layer,
                               head_mask=None if head_mask is None else head_mask[layer],
                               return_weights=return_weights,
                               value_embed=None if table is None else value_embeds[table])
            if return_weights:
                all_weights.append(weights)
        if cache is not None:
            cache.length = start + T
        return self.norm(x), all_weights

    def check_positions(self, positions: torch.Tensor, shape: tuple[int, ...] | None = None) -> int:
        """Given positions (for tokens idx of ``shape`` [B, T]): refused in one line unless int64, of that
        shape, >= 0, and taken by the model's encodings at every value; returns the largest + 1 (the
        encodings' seq_len)."""
        given = list(positions.shape) if isinstance(positions, torch.Tensor) else positions
        if self.positions_refusal is not None:
            raise ValueError(f"positions={given} is invalid for this model: {self.positions_refusal}")
        shape = positions.shape if shape is None else shape
        if not (isinstance(positions, torch.Tensor) and positions.dtype == torch.long
                and positions.shape == shape):
            raise ValueError(f"positions={given} is invalid: must be an int64 tensor shaped like idx "
                             f"{list(shape)}, one position per token")
        low, high = torch.stack(torch.aminmax(positions)).tolist()  # one device sync
        if low < 0:
            raise ValueError(f"positions={given} is invalid: must be >= 0, the smallest is {low}")
        self.pos.check_length(high + 1)
        return high + 1

    def _shift_tokens(self, x: torch.Tensor, cache: KVCache | StreamingCache | None) -> torch.Tensor:
        """Token shift over the token embeddings x [B, T, d_model]. The first token's predecessor is
        the newest token the cache holds (none: zeros), which the cache keeps for the next call."""
        first = None if cache is None else cache.carried_state("token_shift")
        if cache is not None:
            cache.carry("token_shift", x[:, -1:])
        return shift_tokens(x, self.shift_gate, first)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states [..., d_model] -> logits [..., vocab_size], soft-capped if configured
        (in float32: tanh in bfloat16 would round the logits near the cap together)."""
        logits = self.lm_head(hidden)
        return logits if self.cfg.logit_softcap is None else softcap(logits.float(), self.cfg.logit_softcap)

    def forward(self, idx: torch.Tensor, positions: torch.Tensor | None = None, *,
                cache: KVCache | StreamingCache | None = None, head_mask: torch.Tensor | None = None,
                ) -> torch.Tensor:
        """idx [B, T] (at given positions [B, T], or 0..T-1) -> logits [B, T, vocab_size]."""
        return self.logits(self.hidden_states(idx, positions, cache=cache, head_mask=head_mask)[0])

    def loss(self, idx: torch.Tensor, targets: torch.Tensor, positions: torch.Tensor | None = None, *,
             reduction: str = "mean", head_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Next-token cross-entropy in nats (mean, sum, or 'none': the per-token loss [B, T]).

        Targets equal to ``IGNORE_INDEX`` are skipped: their loss is 0 and the mean is over the
        other targets (the passkey recipe scores only the key). Without autograd (evaluation) the
        logits are built LOSS_CHUNK_ELEMENTS at a time, so a long input never holds [B, T, V]
        float32 logits; with autograd the backward pass needs them all.
        """
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"reduction={reduction!r} is invalid: allowed: mean | sum | none")
        hidden, _ = self.hidden_states(idx, positions, head_mask=head_mask)
        hidden, flat_targets = hidden.flatten(0, 1), targets.reshape(-1)  # [B * T, d_model], [B * T]
        rows = hidden.shape[0]
        if not torch.is_grad_enabled():
            rows = max(1, LOSS_CHUNK_ELEMENTS // self.cfg.vocab_size)
        # Each chunk: logits [rows, V] in float32, then its per-token losses [rows].
        per_token = torch.cat([F.cross_entropy(self.logits(h).float(), t, reduction="none")
                               for h, t in zip(hidden.split(rows), flat_targets.split(rows), strict=True)])
        if reduction == "none":
            return per_token.view(targets.shape)
        if reduction == "sum":
            return per_token.sum()
        return per_token.sum() / (flat_targets != IGNORE_INDEX).sum().clamp(min=1)

    def attention_maps(self, idx: torch.Tensor, positions: torch.Tensor | None = None, *,
                       head_mask: torch.Tensor | None = None):
        """(logits [B, T, V], list of attention weights [B, n_head, T, T] per layer), slow path."""
        hidden, weights = self.hidden_states(idx, positions, head_mask=head_mask, return_weights=True)
        return self.logits(hidden), weights

    @torch.no_grad()
    def max_attention_logit(self, idx: torch.Tensor, positions: torch.Tensor | None = None) -> float:
        """The largest |q.k| / sqrt(d) over every layer, head, query and visible key of idx [B, T],
        before any soft-cap: the logit growth that QK-norm and soft-capping exist to bound."""
        attentions = [block.attn for block in self.blocks]
        for attn in attentions:
            attn.largest_logit = torch.zeros((), device=idx.device)
        try:  # the chunked path: memory as in evaluation, no [B, H, T, T] weights kept per layer
            self.hidden_states(idx, positions)
            return max(float(attn.largest_logit) for attn in attentions)
        finally:
            for attn in attentions:
                attn.largest_logit = None

    def num_params(self, *, exclude_embeddings: bool = False) -> int:
        """Parameters counted once (a tied LM head shares the embedding's); without embeddings, less
        the token table and the value-embedding tables."""
        total = sum(p.numel() for p in self.parameters())
        if exclude_embeddings:
            total -= self.tok_emb.weight.numel() + sum(table.weight.numel() for table in self.value_emb)
        return total

    def flops_per_token(self, seq_len: int) -> int:
        """Training FLOPs per token (forward + backward), PaLM's estimate (Chowdhery et al. 2022, B).

        6 x matmul weights (the LM head included, embedding lookups not) plus the attention
        score and value products, 12 * n_head * head_dim * keys per layer (full, not causal): keys
        is seq_len, or the window of a sliding-window layer when shorter.
        """
        cfg = self.cfg
        matmul_params = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        keys = sum(seq_len if window is None else min(seq_len, window) for window in cfg.layer_window)
        return 6 * matmul_params + 12 * cfg.n_head * cfg.head_dim * keys
