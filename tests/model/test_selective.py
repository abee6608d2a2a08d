"""Selective attention (Leviathan et al. 2024): the paper's equations written out in float64 loops,
x-transformers' ``selective_attn`` on the same logits, exact cached decoding, context pruning and
its report, and the refusals.

The generic tests cover it too as the ``selective`` entry of ATTENTION_VARIANTS: cached decoding
with RoPE, ALiBi, xPos and a layout, with every other variant (test_generate.py), the maps of head
analysis (test_heads.py), a small model learning (test_attention_variants.py) and the export
refusal (test_hf_families.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from x_transformers.attend import selective_attn

from nanoattn import GPT, KVCache, ModelConfig, generate
from nanoattn.eval.variant_heads import SELECTIVE_PRUNE_F, selective_pruning, variant_statistics
from nanoattn.generate import Decoding
from nanoattn.mechanisms.score_cap import softcap
from nanoattn.model import Attention, routes
from nanoattn.model.selective import SelectiveBias
from nanoattn.positional import build_positional

LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}
D = 8


def config(**fields) -> ModelConfig:
    base = dict(vocab_size=64, d_model=4 * D, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16, init_std=0.2,
                selective_attn=True)
    return ModelConfig(**{**base, **fields})


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None,
              threshold: float = math.inf, cap: float | None = None) -> torch.Tensor:
    """Section 3 in float64 loops, one sequence: q [H, T, D], k and v [Hkv, T, D], an additive bias
    [H, T, T] or None. L_h = q.k / sqrt(D) (soft-capped: cap tanh(./cap)) + bias;
    S_kj = max(0, L_0[k, j]) for 0 < j < k, else 0; F_ij = sum_{k < i} S_kj; head h attends
    softmax_{j <= i}(L_h[i, j] - F_ij). With a threshold, query i skips the keys with F_ij > threshold
    (context pruning). -> [H, T, D]."""
    q, k, v = q.double(), k.double(), v.double()
    H, T, _ = q.shape
    group = H // k.shape[0]

    def logit(h: int, i: int, j: int) -> float:
        value = float(q[h, i] @ k[h // group, j]) / math.sqrt(q.shape[-1])
        value = value if cap is None else cap * math.tanh(value / cap)
        return value + (0.0 if bias is None else float(bias[h, i, j]))

    s = [[max(0.0, logit(0, i, j)) if 0 < j < i else 0.0 for j in range(T)] for i in range(T)]
    f = [[sum(s[m][j] for m in range(i)) for j in range(T)] for i in range(T)]
    out = torch.zeros(H, T, v.shape[-1], dtype=torch.float64)
    for h in range(H):
        for i in range(T):
            keys = [j for j in range(i + 1) if f[i][j] <= threshold]
            scores = torch.tensor([logit(h, i, j) - f[i][j] for j in keys], dtype=torch.float64)
            out[h, i] = torch.softmax(scores, 0) @ v[h // group, keys]
    return out


def random_heads(n_kv_head: int, T: int = 20, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    # Scaled so head 0's logits are of order 1: F grows to several units and masks keys.
    return (torch.randn(1, 4, T, D, generator=g) * 1.5, torch.randn(1, n_kv_head, T, D, generator=g) * 1.5,
            torch.randn(1, n_kv_head, T, D, generator=g))


@pytest.mark.parametrize("pos, cap", [("nope", None), ("alibi", None), ("nope", 1.5)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_chunked_and_explicit_paths_are_the_papers_equations(monkeypatch, layout, pos, cap):
    """S from the logits the softmax sees: an encoding's bias (ALiBi) and the score cap included."""
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 4 * 6 * 20)  # 6 queries a chunk
    cfg = config(n_kv_head=LAYOUTS[layout], pos=pos, attn_softcap=cap)
    attn, pe = Attention(cfg), build_positional(cfg)
    q, k, v = random_heads(cfg.n_kv_head)
    positions = torch.arange(20)
    bias = pe.bias(q, k, positions, positions, 0)
    expected = reference(q[0], k[0], v[0], None if bias is None else bias, cap=cap).float()[None]

    def fresh() -> SelectiveBias:  # the sums start over for each pass
        return SelectiveBias.start(pe, q, k, lambda s: softcap(s, cap), None, 0)

    chunked = attn.attend_heads(q, k, v, positions, positions, fresh(), 0)[0]
    explicit, weights = attn.attend_heads(q, k, v, positions, positions, fresh(), 0, return_weights=True)
    plain = attn.attend_heads(q, k, v, positions, positions, pe, 0)[0]
    assert (plain - expected).abs().max() > 0.05  # F changes the output
    torch.testing.assert_close(chunked, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(explicit, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 4, 20))


def test_f_is_x_transformers_selective_attn_on_a_whole_sequence():
    """x-transformers subtracts the same F from every head (head 0's ReLU'd logits, the first column
    and the diagonal zeroed, shifted one query, summed). It recomputes without a cache: with cached
    keys it would zero another column and never mask the cached keys; ours keeps the first token's
    column at position 0 and caches the sums (tested below)."""
    cfg = config(pos="nope", n_kv_head=4)
    pe = build_positional(cfg)
    q, k, _ = random_heads(4, seed=1)
    positions = torch.arange(20)
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)  # [1, 4, T, T]
    causal = torch.ones(20, 20, dtype=torch.bool).triu(1)
    sim = scores.masked_fill(causal, -torch.finfo(scores.dtype).max)
    theirs = selective_attn(sim) - sim  # -F, broadcast over the heads
    ours = SelectiveBias.start(pe, q, k, lambda s: s, None, 0).bias(q, k, positions, positions, 0)
    torch.testing.assert_close(ours.expand(1, 4, 20, 20).masked_fill(causal, 0),
                               theirs.masked_fill(causal, 0), atol=1e-5, rtol=1e-5)
    assert theirs.abs().max() > 1  # F is not small


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_decoding_past_the_training_length_equals_recomputation(layout):
    torch.manual_seed(0)
    cfg = config(n_kv_head=LAYOUTS[layout])
    model = GPT(cfg).eval()
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(1))  # 2.5x max_seq_len
    cache = KVCache(cfg, 2, 40)
    with torch.no_grad():
        whole = model(idx)
        steps = [model(idx[:, :7], cache=cache)] + [model(idx[:, t:t + 1], cache=cache) for t in range(7, 40)]
        plain = GPT(config(n_kv_head=LAYOUTS[layout], selective_attn=False)).eval()
        plain.load_state_dict(model.state_dict())
        assert (plain(idx) - whole).abs().max() > 0.05  # the selection acts
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert cache.bytes_per_token() == 2 * 2 * (2 * cfg.n_kv_head * D * 4 + 4)  # K, V and F's sums, 2 layers


def test_given_positions_select_by_token_order_in_every_row():
    """Positions [B, T] (position coupling's repeat and go back) change the encoding's rotation, never
    which keys are earlier: given 0..T-1 equals the default, and the selection acts at any B and T
    (it was silently off at B == T and failed otherwise when it read positions as token order)."""
    torch.manual_seed(0)
    model = GPT(config()).eval()
    plain = GPT(config(selective_attn=False)).eval()
    plain.load_state_dict(model.state_dict())
    for batch, length in ((1, 10), (3, 10), (10, 10)):
        idx = torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(batch))
        order = torch.arange(length).expand(batch, length)
        coupled = torch.randint(0, 16, (batch, length), generator=torch.Generator().manual_seed(5))
        with torch.no_grad():
            torch.testing.assert_close(model(idx, order), model(idx), atol=1e-6, rtol=1e-6)
            assert (plain(idx, coupled) - model(idx, coupled)).abs().max() > 0.05  # the selection acts
            alone = torch.cat([model(idx[b:b + 1], coupled[b:b + 1]) for b in range(batch)])
            torch.testing.assert_close(model(idx, coupled), alone, atol=1e-5, rtol=1e-5)


def test_the_selection_sums_grow_and_stay_zero_for_the_first_token():
    torch.manual_seed(0)
    cfg = config()
    model = GPT(cfg).eval()
    cache = KVCache(cfg, 2, 30)
    idx = torch.randint(0, 64, (2, 30), generator=torch.Generator().manual_seed(2))
    history = []
    with torch.no_grad():
        for t in range(30):
            model(idx[:, t:t + 1], cache=cache)
            history.append(torch.stack([sums.clone() for sums in cache.selection]))
    history = torch.stack(history)  # [steps, n_layer, B, 30]
    assert (history.diff(dim=0) >= 0).all()  # F only grows down a column
    assert (history[:, :, :, 0] == 0).all()  # the first token is never selected
    assert (history[-1, :, :, 1:-1] > 0).any()


def test_pruning_is_the_papers_drop_rule_in_prefill_and_decoding_alike(monkeypatch):
    """With a threshold a query skips the keys whose F passed it: the reference's rule, the same in one
    prefill and token by token; each layer's count of dropped keys is what the last query skipped."""
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 4 * 6 * 20)
    cfg = config(n_layer=1, pos="nope")
    attn, pe = Attention(cfg).eval(), build_positional(cfg)
    q, k, v = random_heads(cfg.n_kv_head, seed=3)
    positions = torch.arange(20)
    cache = KVCache(cfg, 1, 20, prune_threshold=1.0)  # attention reads its threshold and keeps F's sums there
    selective = SelectiveBias.start(pe, q, k, lambda s: s, cache, 0)
    got = attn.attend_heads(q, k, v, positions, positions, selective, 0)[0]
    expected = reference(q[0], k[0], v[0], threshold=1.0).float()[None]
    assert (reference(q[0], k[0], v[0]).float()[None] - expected).abs().max() > 1e-3  # it prunes
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)

    torch.manual_seed(0)
    model = GPT(config()).eval()
    idx = torch.randint(0, 64, (2, 40), generator=torch.Generator().manual_seed(4))
    caches = [KVCache(model.cfg, 2, 40, prune_threshold=1.0) for _ in range(2)]
    with torch.no_grad():
        prefill = model(idx, cache=caches[0])
        steps = torch.cat([model(idx[:, :9], cache=caches[1])]
                          + [model(idx[:, t:t + 1], cache=caches[1]) for t in range(9, 40)], dim=1)
        unpruned = model(idx)
    torch.testing.assert_close(steps, prefill, atol=1e-5, rtol=1e-5)
    assert (unpruned - prefill).abs().max() > 1e-3
    assert caches[0].pruned_tokens() == caches[1].pruned_tokens()
    counts = caches[0].pruned_tokens()
    assert all(0 < n < 2 * 40 for n in counts)
    assert counts == [int((sums > 1.0).sum()) for sums in caches[0].selection]
    slot = 2 * cfg_slot_bytes(model.cfg) + 4  # K, V and one float32 sum, one sequence
    assert caches[0].pruned_bytes() == [n * slot for n in counts]


def cfg_slot_bytes(cfg: ModelConfig) -> int:
    return cfg.n_kv_head * cfg.head_dim * 4


def test_generate_prunes_and_reports_the_bytes_it_frees():
    torch.manual_seed(0)
    model = GPT(config()).eval()
    idx = torch.randint(0, 64, (2, 5), generator=torch.Generator().manual_seed(5))
    kept = Decoding(model, idx, 27, temperature=0, prune_threshold=1e9)  # nothing passes: the model unpruned
    for _ in kept:
        pass
    assert kept.pruned_kv_bytes == 0
    assert torch.equal(kept.idx, generate(model, idx, 27, temperature=0, use_cache=False))
    pruned = Decoding(model, idx, 27, temperature=0, prune_threshold=0.5)
    for _ in pruned:
        pass
    assert pruned.pruned_kv_bytes == sum(pruned.cache.pruned_bytes()) > 0


def test_head_analysis_reports_how_much_each_layer_masked():
    torch.manual_seed(0)
    model = GPT(config()).eval()
    g = torch.Generator().manual_seed(6)
    batches = [(torch.randint(0, 64, (2, 24), generator=g), torch.randint(0, 64, (2, 24), generator=g))
               for _ in range(2)]
    pruned = selective_pruning(model, batches, threshold=0.5)
    kept = selective_pruning(model, batches, threshold=1e9)
    assert all(0 < f < 1 for f in pruned["pruned_fraction"]) and all(b > 0 for b in pruned["pruned_kv_bytes"])
    assert all(0 < m < 1 for m in pruned["masked_mass"]) and len(pruned["masked_mass"]) == 2
    assert kept["pruned_fraction"] == kept["pruned_kv_bytes"] == [0, 0] and kept["mean"] == 0
    # The first layer's F does not depend on what pruning did (later layers' inputs do).
    assert kept["masked_mass"][0] == pruned["masked_mass"][0] != pruned["masked_mass"][1]
    # By hand for one batch of two windows: the share of tokens whose F passed 0.5.
    cache = KVCache(model.cfg, 2, 24, prune_threshold=0.5)
    with torch.no_grad():
        model(batches[0][0], cache=cache)
    assert selective_pruning(model, batches[:1], threshold=0.5)["pruned_fraction"] == [
        n / 48 for n in cache.pruned_tokens()]
    stats = variant_statistics(model, batches)  # what heads.json holds, at the module's threshold
    assert list(stats) == ["selective_attn"] and stats["selective_attn"]["threshold"] == SELECTIVE_PRUNE_F


def test_evaluation_memory_stays_in_chunks(chunks_built, small_chunks):
    """F is never built whole: at 1,024 tokens every bias chunk is within the budget, as ALiBi's."""
    cfg = config(n_layer=1, max_seq_len=256)
    with torch.no_grad():
        GPT(cfg).eval()(torch.randint(0, 64, (1, 1024)))
    sizes = [size for _, _, size in chunks_built]
    assert max(sizes) <= 1 << 16 and len(sizes) == 1024 // ((1 << 16) // (4 * 1024))


@pytest.mark.parametrize("fields, message", [
    (dict(sliding_window=8),
     "model.selective_attn=True is invalid: cannot be combined with sliding_window=8"),
    (dict(diff_attn=True), "model.selective_attn=True is invalid: cannot be combined with diff_attn=True"),
    (dict(selective_attn="yes"), "model.selective_attn='yes' is invalid: must be true or false"),
])
def test_undefined_combinations_are_refused_naming_both_fields(fields, message):
    with pytest.raises(ValueError, match=f"^{message}") as error:
        config(**fields)
    assert "\n" not in str(error.value)


def test_pruning_and_streaming_refusals_name_their_values():
    plain = GPT(config(selective_attn=False)).eval()
    idx = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^generate\.prune_threshold=1\.0 is invalid: needs "
                                         r"model\.selective_attn=True"):
        generate(plain, idx, 2, prune_threshold=1.0)
    model = GPT(config()).eval()
    for value in (-1.0, True, "1", math.nan):
        with pytest.raises(ValueError, match=rf"^KVCache\.prune_threshold={value!r} is invalid: must be a "
                                             "number >= 0"):
            KVCache(model.cfg, 1, 4, prune_threshold=value)
    with pytest.raises(ValueError, match=r"^generate\.prune_threshold=1\.0 is invalid: drops keys from the "
                                         r"KV cache: it needs use_cache=True"):
        generate(model, idx, 2, prune_threshold=1.0, use_cache=False)
    with pytest.raises(ValueError, match=r"^generate\.streaming=\(1, 4\) is invalid: cannot decode "
                                         r"model\.selective_attn=True"):
        generate(model, idx, 2, streaming=(1, 4))
