"""Attention equivalences from the seed documents: fused vs per-head, GQA vs MHA, permutations."""

import math

import pytest
import torch

from nanoattn import GPT, KVCache, ModelConfig, kernels
from nanoattn.mechanisms.score_cap import ScoreCap
from nanoattn.model import Attention, routes
from nanoattn.positional import REGISTRY, build_positional

# Encodings that act inside attention (every one but those added to the embeddings).
ATTENTION_LEVEL = [name for name, encoding in REGISTRY.items() if not encoding.acts_on_embeddings]

torch.manual_seed(0)


def reference_mha(x, wq, wk, wv, wo, n_head, causal=True):
    """The seed's formulation: separate per-head projections, attention per head, concat, W_O."""
    T = x.shape[1]
    hd = wq.shape[0] // n_head
    heads = []
    for i in range(n_head):
        rows = slice(i * hd, (i + 1) * hd)
        q, k, v = x @ wq[rows].T, x @ wk[rows].T, x @ wv[rows].T  # [B, T, hd]
        scores = q @ k.transpose(-2, -1) / math.sqrt(hd)  # [B, T, T]
        if causal:
            scores = scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf"))
        heads.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(heads, dim=-1) @ wo.T  # [B, T, d_model]


def run(attn, cfg, x):
    pos = build_positional(cfg)
    T = x.shape[1]
    return attn(x, pos, torch.arange(T), T)[0]


def split_qkv(attn, cfg):
    d, kv = cfg.d_model, cfg.n_kv_head * cfg.head_dim
    return attn.qkv.weight.split([d, kv, kv], dim=0)


def test_fused_qkv_equals_per_head_projections():
    cfg = ModelConfig(d_model=64, n_head=4, pos="nope")
    attn = Attention(cfg)
    x = torch.randn(2, 10, 64)
    wq, wk, wv = split_qkv(attn, cfg)
    expected = reference_mha(x, wq, wk, wv, attn.proj.weight, cfg.n_head)
    torch.testing.assert_close(run(attn, cfg, x), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_gqa_equals_mha_with_kv_weights_repeated_per_group(n_kv_head):
    gqa_cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=n_kv_head, pos="rope")
    mha_cfg = ModelConfig(d_model=64, n_head=4, pos="rope")
    gqa, mha = Attention(gqa_cfg), Attention(mha_cfg)
    wq, wk, wv = split_qkv(gqa, gqa_cfg)
    groups, hd = 4 // n_kv_head, gqa_cfg.head_dim
    # Query head h reads KV head h // groups: repeat each KV head's rows `groups` times.
    repeat = lambda w: w.view(n_kv_head, hd, -1).repeat_interleave(groups, dim=0).reshape(-1, 64)  # noqa: E731
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        mha.proj.weight.copy_(gqa.proj.weight)
    x = torch.randn(2, 12, 64)
    torch.testing.assert_close(run(gqa, gqa_cfg, x), run(mha, mha_cfg, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [8, 2, 1])
def test_the_kv_cache_shrinks_by_n_head_over_n_kv_head(n_kv_head):
    cfg = ModelConfig(vocab_size=50, d_model=64, n_layer=2, n_head=8, n_kv_head=n_kv_head)
    model = GPT(cfg).eval()
    cache = KVCache(cfg, batch_size=1, capacity=16)
    with torch.no_grad():
        model(torch.randint(0, 50, (1, 16)), cache=cache)
    mha_bytes = 2 * cfg.n_layer * 16 * cfg.d_model * 4  # K and V, every layer, 16 tokens, float32
    assert cache.nbytes * (8 // n_kv_head) == mha_bytes
    assert [k.shape for k in cache.k] == [(1, n_kv_head, 16, cfg.head_dim)] * 2


def test_attention_without_positions_or_mask_is_permutation_equivariant():
    cfg = ModelConfig(d_model=32, n_head=4, pos="nope")
    attn = Attention(cfg)
    wq, wk, wv = split_qkv(attn, cfg)
    x = torch.randn(1, 9, 32)
    perm = torch.randperm(9)
    out = reference_mha(x, wq, wk, wv, attn.proj.weight, 4, causal=False)
    out_perm = reference_mha(x[:, perm], wq, wk, wv, attn.proj.weight, 4, causal=False)
    torch.testing.assert_close(out_perm, out[:, perm], atol=1e-5, rtol=1e-5)


def test_nope_with_causal_mask_is_not_order_blind():
    # The causal mask breaks the symmetry: token t averages over t + 1 values, so a token's
    # output depends on how many tokens precede it and which. Permuting the input therefore
    # does not just permute the output, and a NoPE decoder can learn positions from the mask.
    model = GPT(ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, pos="nope")).eval()
    idx = torch.randint(0, 50, (1, 12))
    perm = torch.randperm(12)
    with torch.no_grad():
        assert not torch.allclose(model(idx[:, perm]), model(idx)[:, perm], atol=1e-4)


@pytest.mark.parametrize("pos", ATTENTION_LEVEL)
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_chunked_mask_path_equals_explicit_attention(monkeypatch, pos, n_kv_head):
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 7 * 40)  # 7 queries a chunk
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, pos=pos)
    attn, pe = Attention(cfg), build_positional(cfg)
    q, k, v = torch.randn(2, 4, 40, 8), torch.randn(2, n_kv_head, 40, 8), torch.randn(2, n_kv_head, 40, 8)
    positions = torch.arange(40)
    fast = attn.attend_heads(q, k, v, positions, positions, pe, 0)[0]
    slow, weights = attn.attend_heads(q, k, v, positions, positions, pe, 0, return_weights=True)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 40))
    assert (weights.triu(1) == 0).all()  # causal


@pytest.mark.parametrize("pos", ["alibi", "fire"])
def test_many_queries_take_the_bias_path_in_causal_query_blocks(chunks_built, pos):
    """Past ``CAUSAL_QUERY_BLOCK`` queries, the bias path's chunks are blocks of that many queries,
    each scored over only the keys up to its last query, and attention is the same function."""
    block = kernels.CAUSAL_QUERY_BLOCK
    T = 2 * block + 22
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, pos=pos)
    attn, pe = Attention(cfg), build_positional(cfg)
    q, k, v = torch.randn(2, 4, T, 8), torch.randn(2, 2, T, 8), torch.randn(2, 2, T, 8)
    positions = torch.arange(T)
    with torch.no_grad():
        slow, _ = attn.attend_heads(q, k, v, positions, positions, pe, 0, return_weights=True)
        fast = attn.attend_heads(q, k, v, positions, positions, pe, 0)[0]
    shapes = [(queries, keys) for queries, keys, _ in chunks_built]
    assert shapes == [(block, block), (block, 2 * block), (22, T)]
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)


def test_alibi_bias_chunks_stay_below_the_materialised_bound(chunks_built, small_chunks):
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, pos="alibi")
    with torch.no_grad():
        GPT(cfg).eval()(torch.randint(0, 50, (1, 1024)))
    assert max(size for _, _, size in chunks_built) <= 1 << 16  # the whole [4, 1024, 1024] bias is 64x that
    assert len(chunks_built) == 1024 // ((1 << 16) // (4 * 1024))


def test_sdpa_fast_path_matches_manual_softmax_in_model():
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, pos="rope")
    model = GPT(cfg).eval()
    idx = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        fast = model(idx)
        slow, weights = model.attention_maps(idx)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    assert len(weights) == 2 and weights[0].shape == (2, 4, 16, 16)


def _bf16_logits_and_grads(model, idx, targets):
    """The logits (as float32) and the loss's gradients, flat, under bf16 autocast."""
    model.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits, loss = model(idx), model.loss(idx, targets)
    loss.backward()
    return logits.float(), torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.fixture
def bf16_matmuls_measured_faster(fresh_attention_timings, monkeypatch):
    """The timing of attn_kernel='auto' answering 'bf16 matmuls' for every shape, so a test sees that
    path on any CPU (where it is faster is the machine's business)."""
    monkeypatch.setattr(kernels, "fastest_kernel", lambda what, shape, candidates: "bf16 matmuls")


@pytest.mark.parametrize("fields", [{}, {"pos": "alibi"}, {"pos": "t5"}, {"diff_attn": True},
                                    {"sliding_window": 12}, {"mla_kv_rank": 16, "n_kv_head": 4},
                                    {"attn_softcap": 5.0}, {"attn_sinks": True}],
                         ids=["rope", "alibi", "t5", "diff", "window", "mla", "softcap", "sinks"])
def test_the_bf16_matmul_kernel_is_as_close_to_float32_as_sdpa(bf16_matmuls_measured_faster, fields):
    """attn_kernel='auto' on CPU in bf16 (two bf16 matmuls and a softmax) against 'sdpa' on the same
    weights: logits and every gradient as close to the float32 model's as SDPA's are, over three causal
    query blocks. A wrong mask, block, group or scale would be off by whole units."""
    cfg = ModelConfig(**{**dict(vocab_size=64, d_model=64, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=160),
                         **fields})
    torch.manual_seed(0)
    auto = GPT(cfg)
    sdpa = GPT(ModelConfig.from_dict({**cfg.to_dict(), "attn_kernel": "sdpa"}))
    sdpa.load_state_dict(auto.state_dict())
    idx, targets = torch.randint(0, 64, (2, 150)), torch.randint(0, 64, (2, 150))
    sdpa.zero_grad()
    exact_logits = sdpa(idx)
    sdpa.loss(idx, targets).backward()
    exact_grads = torch.cat([p.grad.flatten() for p in sdpa.parameters() if p.grad is not None])
    for_auto, for_sdpa = (_bf16_logits_and_grads(m, idx, targets) for m in (auto, sdpa))
    logit_errors = [(logits - exact_logits).abs().max().item() for logits, _ in (for_auto, for_sdpa)]
    grad_errors = [((grads - exact_grads).norm() / exact_grads.norm()).item()
                   for _, grads in (for_auto, for_sdpa)]
    assert logit_errors[0] <= 2 * logit_errors[1] + 1e-3
    assert grad_errors[0] <= 2 * grad_errors[1] + 1e-3


@pytest.mark.parametrize("dtype, length, pos, measured, takes_sdpa, timed_tokens", [
    (torch.bfloat16, 512, "rope", "bf16 matmuls", False, [512]),  # causal, no bias: the bf16 matmuls
    (torch.bfloat16, 300, "rope", "sdpa", True, [512]),            # where SDPA measured faster, SDPA
    # the bias path's query blocks as well, each at its own keys: 64, 128, 192 and 256
    (torch.bfloat16, 256, "alibi", "bf16 matmuls", False, [64, 128, 256]),
    (torch.bfloat16, 1025, "rope", None, True, []),                # past 1024 keys SDPA, without timing
    (torch.float32, 64, "rope", None, True, []),                   # in float32 SDPA, without timing
])
def test_the_attention_kernel_choice(fresh_attention_timings, monkeypatch, dtype, length, pos, measured,
                                     takes_sdpa, timed_tokens):
    """attn_kernel='auto' against 'sdpa' (SDPA wherever it can compute the variant) on the same
    weights: bit for bit the same logits where auto takes SDPA too, other bf16 roundings where it
    takes the matmuls (which 'sdpa' therefore does not). Which is faster is timed once per shape, at
    the keys' next power of two, once for both layers, here replaced by its answer; that the matmuls
    compute the same function is test_the_bf16_matmul_kernel_is_as_close_to_float32_as_sdpa."""
    asked = []
    monkeypatch.setattr(kernels, "fastest_kernel",
                        lambda what, shape, candidates: asked.append(shape) or measured)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, pos=pos, max_seq_len=2048)
    torch.manual_seed(0)
    auto = GPT(cfg).eval()
    sdpa = GPT(ModelConfig.from_dict({**cfg.to_dict(), "attn_kernel": "sdpa"})).eval()
    sdpa.load_state_dict(auto.state_dict())
    idx = torch.randint(0, 50, (1, length))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        assert torch.equal(auto(idx), sdpa(idx)) == takes_sdpa
    timed = [f"q [1, 4, {tokens}, 8] k [1, 2, {tokens}, 8] forward" for tokens in timed_tokens]
    assert [a for a in asked if a.startswith("q ")] == timed


def test_bf16_cached_decoding_with_the_matmul_kernel_follows_the_whole_forward(bf16_matmuls_measured_faster):
    """The prompt goes through the bf16 matmuls, each new token through SDPA: the last logits of
    cached decoding stay within bf16 rounding of the uncached forward's."""
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=64)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 50, (2, 40))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        whole = model(idx).float()
        cache = KVCache(cfg, 2, 40, dtype=torch.bfloat16)
        steps = [model(idx[:, :32], cache=cache)[:, -1]]
        steps += [model(idx[:, t:t + 1], cache=cache)[:, -1] for t in range(32, 40)]
    torch.testing.assert_close(torch.stack(steps, 1).float(), whole[:, 31:], atol=0.05, rtol=0.05)


def test_attn_kernel_refuses_an_unknown_name():
    with pytest.raises(ValueError, match=r"^model.attn_kernel='flash' is invalid: allowed: auto \| sdpa$"):
        ModelConfig(attn_kernel="flash")


@pytest.mark.parametrize("kernel, measure, scores_dtype", [
    ("auto", False, torch.bfloat16),  # the cap and the sinks on the bf16 matmul path
    ("sdpa", False, torch.float32),   # the first round's: explicit scores in float32
    ("auto", True, torch.float32),    # the largest logit is a measurement: float32
])
def test_the_explicit_variants_score_in_bf16_where_the_kernel_choice_says(bf16_matmuls_measured_faster,
                                                                          monkeypatch, kernel, measure,
                                                                          scores_dtype):
    seen = []  # the scores' dtype, as the score cap's hook receives them
    cap = ScoreCap.scores

    def spy(self, scores):
        seen.append(scores.dtype)
        return cap(self, scores)

    monkeypatch.setattr(ScoreCap, "scores", spy)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, attn_softcap=30.0,
                      attn_sinks=True, attn_kernel=kernel)
    model, idx = GPT(cfg).eval(), torch.randint(0, 50, (1, 64))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model.max_attention_logit(idx) if measure else model(idx)
    assert seen and set(seen) == {scores_dtype}
