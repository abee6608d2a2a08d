"""Attention variants: QK-norm (before or after the rotation), soft-capping (scores, logits),
learned sinks, sliding windows with a rolling KV cache and differential attention.

References: the formulas written out by hand, and an explicit whole-matrix attention for the
chunked capped and windowed paths. Each variant against its paper's reference implementation
(transformers' Gemma 2, gpt-oss, DeepSeek attention; differential attention, value embeddings and
token shift written out) is in nanoattn/references, cached decoding in test_generate.py, the
Qwen 3 (QK-norm) and Ministral (sliding windows) exports in test_hf_families.py.
"""

import math
import warnings

import pytest
import torch
from fitting import fit
from variants import VARIANTS

from nanoattn import GPT, KVCache, ModelConfig, generate
from nanoattn.generate import Decoding
from nanoattn.mechanisms.qk_norm import QKNorm
from nanoattn.mechanisms.score_cap import softcap
from nanoattn.model import Attention, routes
from nanoattn.positional import build_positional


def perturbed_norms(attn: Attention, seed: int = 0) -> Attention:
    with torch.no_grad():
        for p in attn.qk_norm.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed)) * 0.3)
    return attn


def test_softcap_is_cap_times_tanh_of_x_over_cap():
    x = torch.tensor([-100.0, -3.0, 0.0, 0.5, 3.0, 100.0])
    expected = torch.tensor([3 * math.tanh(v / 3) for v in x.tolist()])
    torch.testing.assert_close(softcap(x, 3.0), expected)
    assert softcap(x, 3.0).abs().max() <= 3.0  # bounded by the cap
    assert softcap(x, None) is x


def test_qk_norm_divides_each_head_by_its_rms_and_applies_one_gain_per_side():
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, norm_eps=1e-6, qk_norm="before_rope")
    norm = QKNorm(cfg, layer=0)
    with torch.no_grad():
        norm.q.weight.copy_(torch.linspace(0.5, 2.0, 8))
        norm.k.weight.copy_(torch.linspace(2.0, 0.5, 8))
    qk = torch.randn(2, 6, 5, 8, dtype=torch.float64)  # 4 query heads, 2 key heads, 5 tokens, head_dim 8
    out = torch.cat(norm.double().before_rotation(qk[:, :4], qk[:, 4:]), dim=1)
    untouched = torch.cat(norm.after_rotation(qk[:, :4], qk[:, 4:]), dim=1)  # placed before the rotation
    assert torch.equal(untouched, qk)
    rms = qk.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    gains = torch.cat([norm.q.weight.expand(4, 1, 8), norm.k.weight.expand(2, 1, 8)])  # [6, 1, 8]
    torch.testing.assert_close(out, qk / rms * gains)


def test_qk_norm_of_bf16_heads_takes_the_fused_kernel_and_rounds_like_the_composite():
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, qk_norm="after_rope")
    norm = QKNorm(cfg, layer=0)
    with torch.no_grad():
        norm.q.weight.copy_(torch.linspace(0.5, 2.0, 8))
    qk = torch.randn(2, 6, 5, 8).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch warns when it cannot dispatch to the fused kernel
        out = torch.cat(norm.after_rotation(qk[:, :4], qk[:, 4:]), dim=1)
    assert out.dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        composite = torch.cat([norm.q(qk[:, :4]), norm.k(qk[:, 4:])], dim=1)  # bf16 heads, float32 gains
    assert torch.equal(out, composite.bfloat16())


def test_qk_norm_before_and_after_rope_agree_only_while_the_gains_are_uniform():
    """A rotation keeps each head's rms, so with unit gains the order is invisible; learned gains
    weight the dimensions, which the rotation mixes, so the two placements differ."""
    x = torch.randn(2, 12, 32)
    outputs = {}
    for at in ("before_rope", "after_rope"):
        torch.manual_seed(0)
        cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, qk_norm=at)
        attn = Attention(cfg)
        positions = torch.arange(12)
        with torch.no_grad():
            outputs[at, "unit"] = attn(x, build_positional(cfg), positions, 12)[0]
            outputs[at, "learned"] = perturbed_norms(attn)(x, build_positional(cfg), positions, 12)[0]
    torch.testing.assert_close(outputs["before_rope", "unit"], outputs["after_rope", "unit"])
    assert (outputs["before_rope", "learned"] - outputs["after_rope", "learned"]).abs().max() > 1e-3


def test_qk_norm_bounds_the_scores_by_the_gains():
    """|q.k| / sqrt(d) <= sqrt(d) * max gain^2 however large the projections grow: the stability it
    exists for (weights x100 leave the attention maps where they were, up to the norm's epsilon)."""
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, qk_norm="before_rope", norm_eps=1e-10)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 50, (1, 16))
    with torch.no_grad():
        _, before = model.attention_maps(idx)
        model.blocks[0].attn.qkv.weight.mul_(100)
        _, after = model.attention_maps(idx)
    torch.testing.assert_close(before[0], after[0], atol=1e-5, rtol=1e-4)


def reference(q, k, v, *, cap=None, window=None, bias=None):
    """softmax(cap * tanh(q.k / sqrt(d) / cap) + bias) @ v over the keys j with 0 <= i - j < window,
    K/V repeated per group."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    if bias is not None:
        scores = scores + bias
    i, j = torch.arange(q.shape[2])[:, None], torch.arange(k.shape[2])[None, :]
    hidden = (j > i) if window is None else (j > i) | (i - j >= window)
    return torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1) @ v


@pytest.mark.parametrize("pos", ["rope", "alibi", "cope"])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("variant", [dict(attn_softcap=1.5), dict(sliding_window=6),
                                     dict(sliding_window=6, attn_softcap=1.5)], ids=["cap", "window", "both"])
def test_capped_and_windowed_attention_in_query_chunks_equal_the_formula(monkeypatch, pos, n_kv_head,
                                                                        variant):
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 7 * 40)  # 7 queries a chunk
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, pos=pos, **variant)
    attn, pe = Attention(cfg), build_positional(cfg)
    q = torch.randn(2, 4, 40, 8) * 3  # scores well into tanh's curve
    k, v = torch.randn(2, n_kv_head, 40, 8), torch.randn(2, n_kv_head, 40, 8)
    positions = torch.arange(40)
    # The bias over all keys (None for RoPE); CoPE's counts only sum gates between key and query.
    bias = pe.bias(q, k, positions, positions, 0)
    expected = reference(q, k, v, cap=variant.get("attn_softcap"), window=variant.get("sliding_window"),
                         bias=bias)
    torch.testing.assert_close(attn.attend_heads(q, k, v, positions, positions, pe, 0)[0], expected,
                               atol=1e-5, rtol=1e-5)


def test_capped_attention_stays_within_one_chunk_at_a_long_length(chunks_built, small_chunks):
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, attn_softcap=1.5)
    with torch.no_grad():
        GPT(cfg).eval()(torch.randint(0, 50, (1, 1024)))
    sizes = [size for _, _, size in chunks_built]
    assert max(sizes) <= 1 << 16  # the whole [4 heads, 1024, 1024] score matrix would be 64x that
    assert len(sizes) == 1024 // ((1 << 16) // (4 * 1024))


def test_a_windowed_layer_computes_only_keys_inside_its_chunks_windows(chunks_built, small_chunks):
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, sliding_window=64)
    with torch.no_grad():
        GPT(cfg).eval()(torch.randint(0, 50, (1, 1024)))
    # Chunks of 16 queries (1 << 16 / (4 heads x 1024 keys)), each over its own 16 keys and the 63
    # before them: 79 of the 1,024, so the layer's work is O(T x window).
    built = [(queries, keys) for queries, keys, _ in chunks_built]
    assert built[0] == (16, 16) and set(built[4:]) == {(16, 79)}


def test_a_window_covering_the_sequence_is_the_global_model():
    torch.manual_seed(0)
    fields = dict(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, pos="alibi")
    plain = GPT(ModelConfig(**fields)).eval()
    windowed = GPT(ModelConfig(**fields, sliding_window=[24, 30])).eval()
    windowed.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 50, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(windowed(idx), plain(idx))
        assert (GPT(ModelConfig(**fields, sliding_window=8)).eval()(idx) - plain(idx)).abs().max() > 1e-3


def test_a_16x_stream_through_local_layers_holds_only_their_windows():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=3, n_head=4, n_kv_head=2, max_seq_len=16,
                      sliding_window=[8, 8, None], init_std=0.1)
    model = GPT(cfg).eval()
    idx = torch.randint(0, 64, (2, 5))
    n = 16 * 16 - 5  # a 256-token stream
    decoding = Decoding(model, idx, n, temperature=0)
    for _ in decoding:
        pass
    slot_bytes = 2 * 2 * cfg.head_dim * 4  # B x n_kv_head x head_dim float32
    assert [k.shape[2] for k in decoding.cache.k] == [7, 7, 256]  # window - 1 for the local layers
    assert decoding.cache.nbytes == 2 * slot_bytes * (7 + 7 + 256)  # K and V
    assert torch.equal(decoding.idx, generate(model, idx, n, temperature=0, use_cache=False))
    local = KVCache(ModelConfig(**{**cfg.to_dict(), "sliding_window": 8}), 2, 100_000)
    assert local.nbytes == 2 * slot_bytes * 7 * 3  # all-local: nothing grows with the capacity


def test_logit_softcap_caps_forward_loss_and_generation_logits():
    torch.manual_seed(0)
    fields = dict(vocab_size=50, d_model=32, n_layer=1, n_head=4, init_std=0.5)
    plain = GPT(ModelConfig(**fields)).eval()
    capped = GPT(ModelConfig(**fields, logit_softcap=1.5)).eval()
    capped.load_state_dict(plain.state_dict())
    idx = torch.randint(0, 50, (2, 10))
    with torch.no_grad():
        raw, got = plain(idx), capped(idx)
        assert raw.abs().max() > 3  # the cap acts
        torch.testing.assert_close(got, 1.5 * torch.tanh(raw / 1.5))
        loss = torch.nn.functional.cross_entropy(got[:, :-1].flatten(0, 1), idx[:, 1:].flatten())
        torch.testing.assert_close(capped.loss(idx[:, :-1], idx[:, 1:]), loss)
        torch.testing.assert_close(capped.attention_maps(idx)[0], got)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_variant_model_learns_and_its_maps_are_distributions(variant):
    torch.manual_seed(0)
    fields = dict(vocab_size=16, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    model = GPT(ModelConfig(**{**fields, **VARIANTS[variant]}))
    idx = torch.arange(16).repeat(4, 1)  # a fixed sequence to memorise
    losses = fit(model, idx)
    # Half, not less: a logit cap of 1.5 over 16 tokens puts the loss floor at 0.56 nats.
    assert losses[-1] < 0.5 * losses[0]
    with torch.no_grad():
        _, maps = model.eval().attention_maps(idx)
    sums, cfg = maps[0].sum(-1), model.cfg
    if cfg.attn_fn == "sigmoid":  # each weight on its own
        assert ((maps[0] >= 0) & (maps[0] <= 1)).all()
    elif cfg.attn_fn == "stick_breaking":  # less than 1 by the stick left over; the first query has no key
        assert (sums <= 1 + 1e-6).all() and (sums[..., 0] == 0).all()
    elif cfg.attn_sinks:  # less than 1 by what the sinks took
        assert (sums < 1).all()
    elif any(m.overrides("weights") for m in model.blocks[0].attn.mechanisms):
        # A mechanism that changes the weights (talking heads' mix) states their sums in its own tests.
        assert torch.isfinite(sums).all()
    else:
        torch.testing.assert_close(sums, torch.ones(4, cfg.attention_heads, 16), atol=1e-5, rtol=0)
    assert (maps[0].triu(1) == 0).all()


def test_differential_gqa_equals_mha_with_the_key_value_pairs_repeated():
    """4 pairs of query heads over 2 pairs of K/V heads: pairs 0, 1 read K/V pair 0, pairs 2, 3 pair 1."""
    torch.manual_seed(0)
    fields = dict(d_model=128, n_head=8, pos="rope", diff_attn=True)
    gqa, mha = Attention(ModelConfig(**fields, n_kv_head=4)), Attention(ModelConfig(**fields, n_kv_head=8))
    mha.load_state_dict({**gqa.state_dict(), "qkv.weight": mha.qkv.weight}, strict=True)
    D = 16
    q_w, k_w, v_w = gqa.qkv.weight.split([128, 64, 64])
    pair_of = [i // 2 for i in range(4)]  # the GQA K/V pair each MHA pair reads
    rows = lambda w, pairs: torch.cat([w[2 * p * D:(2 * p + 2) * D] for p in pairs])  # noqa: E731
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([q_w, rows(k_w, pair_of), rows(v_w, pair_of)]))
        x = torch.randn(2, 10, 128)
        pe = build_positional(ModelConfig(**fields))
        torch.testing.assert_close(gqa(x, pe, torch.arange(10), 10)[0], mha(x, pe, torch.arange(10), 10)[0])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("qk_norm", "both", "model.qk_norm='both' is invalid"),
    ("qk_norm", True, "allowed: none | before_rope | after_rope"),
    ("attn_softcap", 0, "model.attn_softcap=0 is invalid: must be a positive finite number or null"),
    ("attn_softcap", float("inf"), "attn_softcap=inf"),
    ("logit_softcap", "x", "model.logit_softcap='x' is invalid"),
    ("logit_softcap", -30.0, "must be a positive finite number"),
    ("sliding_window", 0, "model.sliding_window=0 is invalid: each window must be a positive integer"),
    ("sliding_window", [64, "x"], r"model.sliding_window=\[64, 'x'\] is invalid"),
    ("sliding_window", [8, 8, 8, 8, 8], "must be null, a window or a list of 1 to n_layer=4 windows"),
    ("sliding_window", 2.5, "model.sliding_window=2.5 is invalid"),
    ("diff_attn", "yes", "model.diff_attn='yes' is invalid"),
])
def test_bad_variant_settings_are_one_line_errors(field, value, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|")) as info:
        ModelConfig(**{field: value})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("fields", "message"), [
    (dict(n_head=4, n_kv_head=1), "model.n_kv_head=1 is invalid: must be even with diff_attn=True"),
    (dict(d_model=96, n_head=6, n_kv_head=3), "model.n_kv_head=3 is invalid: must be even"),
    (dict(pos="alibi"),
     "model.diff_attn=True is invalid: needs encodings without an attention bias .*adds alibi"),
    (dict(pos=["rope", "t5"]), "pos=\\['rope', 't5'\\] adds t5"),
    (dict(attn_sinks=True), "model.attn_sinks=True is invalid: cannot be combined with diff_attn=True"),
])
def test_differential_attention_refuses_what_it_is_not_defined_for(fields, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{"d_model": 64, "n_layer": 2, "n_head": 4, "n_kv_head": 2, "diff_attn": True, **fields})


def test_max_attention_logit_is_the_largest_visible_score_and_qk_norm_bounds_it():
    torch.manual_seed(0)
    fields = dict(vocab_size=50, d_model=32, n_layer=1, n_head=4, n_kv_head=2, pos="nope", init_std=0.3)
    model = GPT(ModelConfig(**fields)).eval()
    idx = torch.randint(0, 50, (2, 12))
    with torch.no_grad():  # by hand: one layer, no positions, the causal keys only
        h = model.blocks[0].attn_norm(model.tok_emb(idx))
        q, k, _ = (h @ model.blocks[0].attn.qkv.weight.T).split([32, 16, 16], dim=-1)
        q = q.view(2, 12, 4, 8).transpose(1, 2)
        k = k.view(2, 12, 2, 8).transpose(1, 2).repeat_interleave(2, 1)  # each K/V head serves 2 query heads
        future = torch.ones(12, 12).triu(1).bool()
        scores = (q @ k.transpose(-2, -1) / math.sqrt(8)).abs().masked_fill(future, 0)
    assert model.max_attention_logit(idx) == pytest.approx(scores.max().item(), rel=1e-5)
    assert model.blocks[0].attn.largest_logit is None  # tracking is off again
    normed = GPT(ModelConfig(**fields, qk_norm="before_rope", norm_eps=1e-10)).eval()
    for net in (model, normed):
        with torch.no_grad():
            before = net.max_attention_logit(idx)
            net.blocks[0].attn.qkv.weight.mul_(10)
            after = net.max_attention_logit(idx)
        # Plain: q.k grows with the square of the weights; normalised: at most sqrt(8) x gain^2 = 2.83.
        bounded = after <= math.sqrt(8) + 1e-4
        assert after == pytest.approx(100 * before, rel=1e-4) if net is model else bounded


@pytest.mark.parametrize(("n_layer", "tables", "expected"), [
    (4, 0, (None, None, None, None)),
    (4, 1, (0, None, None, 0)),
    (4, 2, (0, 1, 0, 1)),
    (6, 2, (0, 1, None, None, 0, 1)),
])
def test_value_embedding_tables_feed_the_first_and_the_last_layers(n_layer, tables, expected):
    cfg = ModelConfig(d_model=32, n_layer=n_layer, n_head=4, n_kv_head=2, value_embeds=tables)
    assert cfg.layer_value_embed == expected
    model = GPT(cfg)
    assert [tuple(table.weight.shape) for table in model.value_emb] == [(cfg.vocab_size, 16)] * tables
    assert [block.attn.value_mix is not None for block in model.blocks] == [t is not None for t in expected]
    assert model.num_params(exclude_embeddings=True) == (
        model.num_params() - cfg.vocab_size * (32 + 16 * tables))


@pytest.mark.parametrize(("fields", "message"), [
    (dict(value_embeds=3), "model.value_embeds=3 is invalid: must be an integer from 0 to n_layer / 2 = 2"),
    (dict(value_embeds=-1), "model.value_embeds=-1 is invalid: must be an integer from 0"),
    (dict(value_embeds=1.5), "model.value_embeds=1.5 is invalid: must be an integer"),
    (dict(value_embeds=True), "model.value_embeds=True is invalid: must be an integer"),
    (dict(value_embeds=1, mla_kv_rank=16, n_kv_head=4),
     "model.value_embeds=1 is invalid: must be 0 with mla_kv_rank"),
])
def test_value_embeddings_refuse_what_they_are_not_defined_for(fields, message):
    with pytest.raises(ValueError, match=message) as info:
        ModelConfig(**{"d_model": 64, "n_layer": 4, "n_head": 4, "n_kv_head": 2, **fields})
    assert "\n" not in str(info.value)


def test_value_embeddings_add_only_their_tables_and_mixes_and_learn():
    """Their function against a v + b E[token] written into the plain model: nanoattn/references."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=4, n_head=4, n_kv_head=2, max_seq_len=16)
    embedded = GPT(ModelConfig(**fields, value_embeds=1))
    missing, unexpected = GPT(ModelConfig(**fields)).load_state_dict(embedded.state_dict(), strict=False)
    assert not missing and set(unexpected) == {"value_emb.0.weight", "blocks.0.attn.value_mix",
                                               "blocks.3.attn.value_mix"}
    idx = torch.randint(0, 40, (2, 16))
    embedded.loss(idx[:, :-1], idx[:, 1:]).backward()
    assert embedded.value_emb[0].weight.grad.abs().sum() > 0
    assert embedded.blocks[3].attn.value_mix.grad.abs().sum() > 0


def test_token_shift_starts_as_the_plain_model_and_its_gate_learns():
    """Its function against e_t + g e_(t-1) written into the plain model: nanoattn/references."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16, pos="learned")
    shifted = GPT(ModelConfig(**fields, token_shift=True)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    missing, unexpected = plain.load_state_dict(shifted.state_dict(), strict=False)
    assert not missing and unexpected == ["shift_gate"]
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(shifted(idx), plain(idx))  # the gate starts at 0: the plain model
    shifted.train().loss(idx[:, :-1], idx[:, 1:]).backward()
    assert shifted.shift_gate.grad.abs().sum() > 0


def test_token_shift_refuses_what_is_not_a_bool():
    message = "^model.token_shift='yes' is invalid: must be true or false$"
    with pytest.raises(ValueError, match=message) as info:
        ModelConfig(token_shift="yes")
    assert "\n" not in str(info.value)
