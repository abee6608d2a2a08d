"""Head analysis: slow path = fast path, hand-built heads get their kind, masking, importance, pruning.

References: a model whose weights are set by hand so each head's attention is known; the uniform
attention of a zero-query head against the closed-form entropy and offsets; a zeroed W_O for
"no attention sublayer"; masks applied to the concatenated head outputs read off W_O's input.
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf
from test_one_line_errors import run_script
from variants import VARIANTS

from nanoattn import GPT, ModelConfig
from nanoattn.checkpoint import resolve_checkpoint, save_checkpoint
from nanoattn.commands.analyze_heads import HeadAnalysisConfig, analyze_heads
from nanoattn.config import DataConfig, TokenizerConfig
from nanoattn.config.options import ATTENTION_VARIANTS
from nanoattn.data import EOT, prepare_data
from nanoattn.data.tokenizer import build_tokenizer
from nanoattn.eval.heads import (
    BROAD_MIN_ENTROPY,
    FIRST_QUERY,
    LOCAL_MAX_OFFSET,
    POSITIONAL_MASS,
    ablation_importance,
    attention_maps,
    classify_head,
    delimiter_ids,
    gradient_importance,
    head_statistics,
    least_important,
    mean_loss,
    prune_heads,
    pruning_curve,
    query_statistics,
)
from nanoattn.eval.plots import plot_attention_grid, plot_attention_head
from nanoattn.eval.runs import load_for_eval, run_data_dir
from nanoattn.eval.variant_heads import own_statistic, variant_statistics
from nanoattn.mechanisms.output_gate import GATE_NEAR_ZERO
from nanoattn.model import routes
from nanoattn.positional import REGISTRY
from nanoattn.validation import from_dict

ROOT = Path(__file__).resolve().parents[2]
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}


def small_model(n_kv_head: int = 4, seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    fields = dict(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head, max_seq_len=32)
    return GPT(ModelConfig(**{**fields, **overrides})).eval()


def random_batches(n: int = 3, batch_size: int = 2, seq_len: int = 16, vocab: int = 50, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    windows = [torch.randint(0, vocab, (batch_size, seq_len + 1), generator=g) for _ in range(n)]
    return [(w[:, :-1], w[:, 1:]) for w in windows]


# --- slow path = fast path ------------------------------------------------------------------------------

ENCODINGS = [(pos, None) for pos in REGISTRY] + [
    ("rope", {"type": "linear", "factor": 2.0}),
    ("rope", {"type": "yarn", "factor": 4.0}),
    ("rope", {"type": "dynamic", "factor": 2.0}),
]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("pos", "scaling"), ENCODINGS,
                         ids=[f"{p}-{(s or {}).get('type', '')}" for p, s in ENCODINGS])
def test_attention_maps_slow_path_equals_fast_path(monkeypatch, pos, scaling, layout):
    # Small chunks so the bias path (ALiBi) really splits its queries.
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 5 * 24)
    check_maps(small_model(LAYOUTS[layout], pos=pos, rope_scaling=scaling))


# Differential attention pairs K/V heads, so its MQA is one pair (n_kv_head=2, the gqa layout).
# Latent attention is MHA over its latent: its variant sets n_kv_head = n_head whatever the layout.
VARIANT_LAYOUTS = [(variant, layout) for variant in VARIANTS for layout in LAYOUTS
                   if (variant, layout) != ("diff", "mqa") and (variant != "mla" or layout == "mha")]


@pytest.mark.parametrize(("variant", "layout"), VARIANT_LAYOUTS)
def test_attention_maps_of_the_variants_equal_their_fast_path(monkeypatch, variant, layout):
    # The capped scores are computed in chunks on the fast path and whole on the slow one.
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 5 * 24)
    model = small_model(**{"n_kv_head": LAYOUTS[layout], "init_std": 0.2, **VARIANTS[variant]})
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "qk_norm" in name or "sinks" in name:  # gains off 1, sinks off 0: they must act
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    check_maps(model)


def check_maps(model: GPT) -> None:
    """The slow path's logits equal the fast path's, with and without a head mask; its weights are
    causal distributions, less what learned sinks took or the stick-breaking stick left (their
    statistic is the rest), or sigmoid weights, each in [0, 1]; a differential map's rows sum to 1
    too (it is normalised by 1 - lambda)."""
    idx = torch.randint(0, 50, (2, 24))
    heads = model.cfg.attention_heads
    mask = torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0, 2.0]])[:, :heads]
    for head_mask in (None, mask):
        with torch.no_grad():
            fast = model(idx, head_mask=head_mask)
            slow, weights = model.attention_maps(idx, head_mask=head_mask)
        torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
        for w in weights:
            assert w.shape == (2, heads, 24, 24)
            if model.cfg.attn_sinks or model.cfg.attn_fn == "stick_breaking":
                sink = query_statistics(w, torch.zeros(2, 24, dtype=torch.bool))["sink_mass"]
                # The perturbed sinks take a share of every row; the stick is left in some rows only.
                assert (sink > 0).all() if model.cfg.attn_sinks else (sink >= 0).all()
                assert sink.mean() > 0.01
                torch.testing.assert_close(w.sum(-1)[..., FIRST_QUERY:] + sink,
                                           torch.ones(2, heads, 24 - FIRST_QUERY))
            elif model.cfg.attn_fn == "sigmoid":
                assert ((w >= 0) & (w <= 1)).all()
            else:
                torch.testing.assert_close(w.sum(-1), torch.ones(2, heads, 24))
            assert (w.triu(1) == 0).all()  # causal


# --- each variant's own statistic ----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["headwise", "elementwise"])
def test_the_gate_statistic_is_each_heads_mean_gate_and_the_share_near_zero(mode):
    """W_g = 0 with a bias of -10 on layer 0's head 1 (every channel of it, elementwise): that head's
    gate is sigmoid(-10) whatever the input, every other one sigmoid(0) = 0.5."""
    model = small_model(2, bias=True, attn_gate=mode)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.output_gate.proj.weight.zero_()
        bias = model.blocks[0].attn.output_gate.proj.bias
        bias.view(4, -1)[1] = -10.0
    stats = variant_statistics(model, random_batches())
    assert list(stats) == ["attn_gate"]
    expected = torch.full((2, 4), 0.5, dtype=torch.float64)
    expected[0, 1] = torch.sigmoid(torch.tensor(-10.0, dtype=torch.float64))
    torch.testing.assert_close(torch.tensor(stats["attn_gate"]["mean_gate"], dtype=torch.float64), expected)
    assert stats["attn_gate"]["near_zero"] == 1 / 8 and expected[0, 1] < GATE_NEAR_ZERO
    assert stats["attn_gate"]["mean"] == pytest.approx(float(expected.mean()))


def test_the_xsa_statistic_is_the_squared_cosine_of_each_output_with_its_own_value():
    """One layer without positions, written out: y_i = sum_j a_ij v_j per head, then cos^2(y_i, v_i)
    (v_i of the head's K/V group) averaged over the queries from FIRST_QUERY on."""
    model = small_model(2, n_layer=1, pos="nope", xsa=True, init_std=0.2)
    batches = random_batches()
    shares = []
    with torch.no_grad():
        for x, _ in batches:
            h = model.blocks[0].attn_norm(model.tok_emb(x)).double()
            q, k, v = (h @ model.blocks[0].attn.qkv.weight.double().T).split([32, 16, 16], dim=-1)
            q, k, v = (t.view(2, 16, -1, 8).transpose(1, 2) for t in (q, k, v))
            k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)  # [B, 4, T, 8]
            future = torch.ones(16, 16, dtype=torch.bool).triu(1)
            y = torch.softmax((q @ k.transpose(-2, -1) / 8 ** 0.5).masked_fill(future, -math.inf), -1) @ v
            cos = (y * v).sum(-1) / (y.norm(dim=-1) * v.norm(dim=-1))  # [B, 4, T]
            shares.append(cos.square()[..., FIRST_QUERY:])
    expected = torch.cat(shares).mean((0, 2))  # [4]
    stats = variant_statistics(model, batches)["xsa"]
    torch.testing.assert_close(torch.tensor(stats["removed"][0], dtype=torch.float64), expected)
    assert 0 < stats["mean"] < 1


def test_the_ssmax_and_canon_statistics_read_their_parameters():
    """s per query head, and s log n at the windows' last query: n = 16 keys, or the 6 of a window."""
    model = small_model(2, ssmax=True, sliding_window=[6, None], canon=3)
    with torch.no_grad():
        model.blocks[0].attn.ssmax.s.copy_(torch.tensor([0.1, 0.2, 0.3, 0.4]))
    stats = variant_statistics(model, random_batches(seq_len=16))
    assert list(stats) == ["ssmax", "canon"]
    assert stats["ssmax"]["s"][0] == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert stats["ssmax"]["factor"][0] == pytest.approx([s * math.log(6) for s in (0.1, 0.2, 0.3, 0.4)])
    assert stats["ssmax"]["factor"][1] == pytest.approx([math.log(16) / math.log(32)] * 4)  # s from 1/log 32
    weight = model.blocks[1].canon.weight  # [d_model, 3], the last tap the token itself
    assert stats["canon"]["taps"][1] == pytest.approx(weight.abs().mean(0).flip(0).tolist())
    assert variant_statistics(small_model(), random_batches()) == {}


# The attention lab's `own stat`: each variant's statistic by name, and what bounds it.
OWN_STATISTICS = {"gate": ("mean gate", 0, 1), "xsa": ("share removed", 0, 1),
                  "selective": ("pruned fraction", 0, 1), "ssmax": ("s log n", 0, math.inf),
                  "canon": ("tap share before", 0, 1), "fox": ("forget span", 1, 16),
                  "stick_breaking": ("unassigned mass", 0, 1), "sigmoid": ("weight sum", 0, 16),
                  "sinks": ("sink mass", 0, 1)}


@pytest.mark.parametrize("variant", ["plain", *OWN_STATISTICS])
def test_each_variant_has_one_own_statistic_the_mean_over_its_heads(variant):
    model = small_model(init_std=0.2, **ATTENTION_VARIANTS[variant])
    batches = random_batches(n=2)
    own = own_statistic(model, batches)
    if variant == "plain":
        assert own is None
        return
    name, low, high = OWN_STATISTICS[variant]
    assert own[0] == name and low < own[1] < high
    per_head = {"forget span": "forget_span", "unassigned mass": "sink_mass", "weight sum": "weight_sum",
                "sink mass": "sink_mass"}.get(name)
    if per_head is not None:  # an attention-map statistic: its mean over every head of every layer
        records = head_statistics(model, batches)
        assert own[1] == pytest.approx(sum(r[per_head] for r in records) / len(records))


# --- a model with known heads ---------------------------------------------------------------------------

T, VOCAB, DELIMITERS = 32, 8, (0, 1)
POINTER_KINDS = ["previous_token", "first_token", "current_token", "delimiter", "broad"]


def pointer_model() -> GPT:
    """One layer, five heads set by hand: previous token, first token, itself, delimiters, uniform.

    The residual input is x_t = e_{pos(t)} (one-hot in dims 0..31, a learned table set to the
    identity) + e_32 when token t is a delimiter. RMSNorm scales it to entries of about 9-13, and
    the query/key rows below read those coordinates, so the intended key scores about 20-28 and
    every other key 0. Causal attention includes the query itself, so a previous-token head needs
    q_i to match k_{i-1}: its query rows are the key rows shifted by one position.
    """
    cfg = ModelConfig(vocab_size=VOCAB, d_model=160, n_layer=1, n_head=5, max_seq_len=T, pos="learned",
                      norm="rmsnorm", mlp="gelu", bias=False, tie_embeddings=False)
    model = GPT(cfg).eval()
    D, eye = cfg.head_dim, torch.eye(T)
    W = torch.zeros(3 * cfg.d_model, cfg.d_model)  # fused [q; k; v] rows, each block 5 heads x 32

    def q(h):
        return slice(h * D, (h + 1) * D)

    def k(h):
        return slice(cfg.d_model + h * D, cfg.d_model + (h + 1) * D)

    W[q(0), :T] = torch.diag(torch.ones(T - 1), 1)  # q_i = e_{i-1}
    W[k(0), :T] = eye  # k_j = e_j
    W[q(1).start, :T] = 1.0  # every query = e_0 ...
    W[k(1), :T] = eye  # ... matches key 0 only
    W[q(2), :T] = eye
    W[k(2), :T] = eye
    W[q(3).start, :T] = 1.0  # a constant query ...
    W[k(3).start, T] = 1.0  # ... matches the delimiter flag
    # head 4: zero queries, so uniform attention over the visible prefix
    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.copy_(W)
        model.tok_emb.weight.zero_()
        model.tok_emb.weight[list(DELIMITERS), T] = 1.0
        model.pos.table.weight.copy_(torch.eye(T, cfg.d_model))
    return model


def test_hand_built_heads_are_classified_and_match_closed_forms():
    model = pointer_model()
    batches = random_batches(n=2, batch_size=4, seq_len=T, vocab=VOCAB)
    maps = attention_maps(model, batches[0][0])[:, 0]  # [B, 5, T, T]
    assert (torch.diagonal(maps[:, 0], offset=-1, dim1=-2, dim2=-1) > 0.99).all()
    assert (maps[:, 1, :, 0] > 0.99).all()
    assert (torch.diagonal(maps[:, 2], dim1=-2, dim2=-1) > 0.99).all()

    heads = head_statistics(model, batches, DELIMITERS)
    assert [r["kind"] for r in heads] == POINTER_KINDS
    assert heads[0]["prev_token_mass"] > 0.99 and heads[0]["mean_offset"] == pytest.approx(1.0, abs=1e-2)
    assert heads[2]["current_token_mass"] > 0.99 and heads[2]["entropy"] < 1e-2
    # The uniform head: query i spreads 1/(i+1) over keys 0..i.
    i = torch.arange(FIRST_QUERY, T, dtype=torch.float64)
    uniform = heads[4]
    assert uniform["entropy"] == pytest.approx(float(torch.log(i + 1).mean()), rel=1e-5)
    assert uniform["normalized_entropy"] == pytest.approx(1.0, rel=1e-5)
    assert uniform["mean_offset"] == pytest.approx(float((i / 2).mean()), rel=1e-5)
    assert uniform["first_token_mass"] == pytest.approx(float((1 / (i + 1)).mean()), rel=1e-5)
    assert uniform["prev_token_mass"] == pytest.approx(float((1 / (i + 1)).mean()), rel=1e-5)
    share = torch.cat([torch.isin(x, torch.tensor(DELIMITERS)).double().cumsum(1)[:, FIRST_QUERY:] / (i + 1)
                       for x, _ in batches])  # [windows, queries]: delimiters among the visible keys
    assert uniform["delimiter_mass"] == pytest.approx(float(share.mean()), rel=1e-5)
    assert [r["kv_group"] for r in heads] == [0, 1, 2, 3, 4]


@torch.no_grad()
def first_layer_scores(model: GPT, x: torch.Tensor) -> torch.Tensor:
    """The first layer's q.k / sqrt(d) [B, H, T, T] by hand in float64 (NoPE, MHA)."""
    attn, H, D = model.blocks[0].attn, model.cfg.n_head, model.cfg.head_dim
    h = model.blocks[0].attn_norm(model.tok_emb(x)).double()  # [B, T, d_model]
    q, k, _ = (h @ attn.qkv.weight.double().T).split(H * D, dim=-1)
    q, k = (t.view(*x.shape, H, D).transpose(1, 2) for t in (q, k))  # [B, H, T, D]
    return q @ k.transpose(-2, -1) / math.sqrt(D)


@pytest.mark.parametrize("attn_fn", ["stick_breaking", "sigmoid"])
def test_the_mass_a_score_function_leaves_or_adds_is_its_statistic(attn_fn):
    """Stick-breaking's ``sink_mass`` is the stick left, prod_{k<i} (1 - sigma(s_ik)) (Tan et al.);
    sigmoid's ``weight_sum`` is sum_{j<=i} sigma(s_ij - log n) (Ramapuram et al.); a softmax's are 0
    and 1."""
    model = small_model(pos="nope", init_std=0.2, attn_fn=attn_fn)
    batches = random_batches(n=2)
    records = head_statistics(model, batches)[:4]  # the first layer's heads
    expected = []
    for x, _ in batches:
        s = first_layer_scores(model, x)
        i, j = torch.arange(16)[:, None], torch.arange(16)[None, :]
        if attn_fn == "stick_breaking":
            per_query = torch.sigmoid(-s).masked_fill(j >= i, 1).prod(-1)  # [B, H, T]
        else:
            per_query = torch.sigmoid(s - math.log(32)).masked_fill(j > i, 0).sum(-1)
        expected.append(per_query[..., FIRST_QUERY:])
    expected = torch.cat(expected).mean(dim=(0, 2))  # [H]
    name = "sink_mass" if attn_fn == "stick_breaking" else "weight_sum"
    assert [r[name] for r in records] == pytest.approx(expected.tolist(), rel=1e-5)
    assert expected.min() > 0.01 and expected.max() < 0.99  # a share that shows
    plain = head_statistics(small_model(pos="nope", init_std=0.2), batches)
    assert all(r["sink_mass"] < 1e-6 and r["weight_sum"] == pytest.approx(1.0) for r in plain)


def test_the_forget_span_counts_the_keys_the_gates_leave_above_one_over_e():
    """For query i, the keys j <= i with sum_{t=j+1..i} log f_t >= -1 (Lin et al.'s gates), averaged
    over queries; without gates every key the query sees, i + 1."""
    model = small_model(pos="nope", forget_gate=True)
    with torch.no_grad():
        gate = model.blocks[0].attn.forget_gate.proj
        gate.weight.normal_(0, 0.3)
        gate.bias.copy_(torch.tensor([-1.0, 1.0, 3.0, 6.0]))  # from a few tokens to most of the window
    batches = random_batches(n=2)
    spans = []
    for x, _ in batches:
        with torch.no_grad():
            h = model.blocks[0].attn_norm(model.tok_emb(x)).double()
            log_f = F.logsigmoid(h @ gate.weight.double().T + gate.bias.double())  # [B, T, H]
        span = torch.zeros(2, 4, 16 - FIRST_QUERY)
        for b in range(2):
            for head in range(4):
                for i in range(FIRST_QUERY, 16):
                    span[b, head, i - FIRST_QUERY] = sum(
                        float(log_f[b, j + 1:i + 1, head].sum()) >= -1 for j in range(i + 1))
        spans.append(span)
    expected = torch.cat(spans).mean(dim=(0, 2))
    records = head_statistics(model, batches)
    assert [r["forget_span"] for r in records[:4]] == pytest.approx(expected.tolist(), rel=1e-6)
    assert expected[0] < 3 and expected[3] > 8 and (expected.diff() > 0).all()
    i = torch.arange(FIRST_QUERY, 16, dtype=torch.float64)
    no_gates = head_statistics(small_model(pos="nope"), batches)
    assert all(r["forget_span"] == pytest.approx(float((i + 1).mean())) for r in no_gates)


def test_kind_rules_and_their_thresholds():
    base = dict(first_token_mass=0.1, prev_token_mass=0.1, current_token_mass=0.1, delimiter_mass=0.2,
                mean_offset=20.0, normalized_entropy=0.9, sink_mass=0.0)
    assert classify_head(base) == "broad"
    assert classify_head({**base, "normalized_entropy": BROAD_MIN_ENTROPY - 0.01}) == "mixed"
    assert classify_head({**base, "mean_offset": LOCAL_MAX_OFFSET}) == "local"
    assert classify_head({**base, "delimiter_mass": 0.5}) == "delimiter"
    assert classify_head({**base, "current_token_mass": POSITIONAL_MASS}) == "current_token"
    previous = {**base, "prev_token_mass": POSITIONAL_MASS, "delimiter_mass": 0.9}  # position wins
    assert classify_head(previous) == "previous_token"
    assert classify_head({**base, "first_token_mass": 0.8, "mean_offset": 1.0}) == "first_token"
    assert classify_head({**base, "sink_mass": POSITIONAL_MASS, "first_token_mass": 0.4}) == "sink"


@pytest.mark.parametrize("kind", ["bpe", "char", "byte"])
def test_delimiters_come_from_the_decoded_token_strings(kind):
    text = ("Now is the winter of our discontent, made glorious summer by this sun of York;\n"
            "and all the clouds that lour'd upon our house -- in the deep bosom of the ocean buried!\n\n"
            "What? Is it so... Then tell me, friend: where is thy master, and where thy horse?\n") * 3
    tokenizer = build_tokenizer(TokenizerConfig(type=kind, vocab_size=280), [text])
    found = set(delimiter_ids(tokenizer))
    for mark in [",", ";", "\n", "?", "!", ":", "-"]:
        (token,) = tokenizer.encode(mark).ids
        assert token in found, mark
    assert tokenizer.token_to_id(EOT) in found
    for word in ["winter", "York", "master", " ", "12"]:
        assert not found & set(tokenizer.encode(word).ids), word


# --- masking --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("bias", [False, True])
def test_masking_every_head_of_a_layer_removes_its_attention_sublayer(layout, bias):
    model = small_model(LAYOUTS[layout], bias=bias, pos="learned" if bias else "rope")
    idx = torch.randint(0, 50, (2, 16))
    removed = copy.deepcopy(model)
    with torch.no_grad():
        removed.blocks[1].attn.proj.weight.zero_()  # the heads' output is gone; W_O's bias stays
        expected = removed(idx)
        masked = model(idx, head_mask=prune_heads(model, [(1, h) for h in range(4)]))
        torch.testing.assert_close(masked, expected, atol=1e-6, rtol=1e-6)
        assert not torch.allclose(model(idx), expected, atol=1e-4)


@pytest.mark.parametrize("layout", ["gqa", "mqa"])
def test_pruning_a_query_head_leaves_the_rest_of_its_kv_group_unchanged(layout):
    model = small_model(LAYOUTS[layout])
    group = 4 // LAYOUTS[layout]
    captured = []
    hook = model.blocks[1].attn.proj.register_forward_pre_hook(lambda _, args: captured.append(args[0]))
    idx = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        model(idx)
        model(idx, head_mask=prune_heads(model, [(1, 1)]))
    hook.remove()
    full, pruned = (c.view(2, 16, 4, 8) for c in captured)  # [B, T, n_head, head_dim]: W_O's input
    assert (pruned[:, :, 1] == 0).all() and not (full[:, :, 1] == 0).all()
    for head in (0, 2, 3):  # head 0 shares head 1's K/V (group of `group`), the others do not
        torch.testing.assert_close(pruned[:, :, head], full[:, :, head], atol=0, rtol=0)
    assert 0 // group == 1 // group


def test_prune_heads_builds_the_mask_and_rejects_bad_pairs():
    model = small_model()
    mask = prune_heads(model, [(0, 3), [1, 0]])
    expected = torch.ones(2, 4)
    expected[0, 3] = expected[1, 0] = 0
    assert torch.equal(mask, expected)
    for bad in [(2, 0), (0, 4), (-1, 0), (0,), ("a", 1)]:
        with pytest.raises(ValueError, match=r"head=.* is invalid: expected \[layer, head\] with 0 <= layer"):
            prune_heads(model, [bad])


# --- importance and pruning -----------------------------------------------------------------------------


def test_ablation_importance_is_the_loss_increase_of_masking_each_head():
    model, batches = small_model(2), random_batches()
    importance = ablation_importance(model, batches)
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    with torch.no_grad():
        base = float(model.loss(x, y))
        mask = torch.ones(2, 4)
        mask[1, 2] = 0
        assert importance[1, 2] == pytest.approx(float(model.loss(x, y, head_mask=mask)) - base, abs=1e-6)
    assert mean_loss(model, batches) == pytest.approx(base, abs=1e-6)


def test_gradient_importance_is_the_mean_absolute_mask_gradient():
    model, batches = small_model(2), random_batches()
    expected = torch.zeros(2, 4, dtype=torch.float64)
    for x, y in batches:
        mask = torch.ones(2, 4, requires_grad=True)
        model.loss(x, y, head_mask=mask).backward()
        expected += mask.grad.abs().double() / len(batches)
    torch.testing.assert_close(gradient_importance(model, batches), expected)


@pytest.mark.parametrize("method", [ablation_importance, gradient_importance])
def test_importance_ordering_is_stable_and_finds_an_amplified_head(method):
    orders = []
    for _ in range(2):
        model, batches = small_model(2, seed=3), random_batches(seed=5)
        with torch.no_grad():
            model.blocks[1].attn.proj.weight[:, 2 * 8:3 * 8] *= 30.0  # head (1, 2) now dominates layer 1
        importance = method(model, batches)
        orders.append(least_important(importance, 1.0))
        assert orders[-1][-1] == (1, 2)
    assert orders[0] == orders[1]


@pytest.mark.parametrize("scope", ["global", "layer"])
def test_pruning_curve_starts_at_the_unpruned_loss_and_masks_the_least_important(scope):
    model, batches = small_model(2), random_batches()
    importance = ablation_importance(model, batches)
    curve = pruning_curve(model, batches, importance, scope=scope, steps=4)
    assert curve[0]["pruned"] == 0 and curve[0]["loss"] == mean_loss(model, batches)
    assert [r["fraction"] for r in curve] == [0.0, 0.25, 0.5, 0.75, 1.0]
    ranked = sorted((float(importance[l, h]), l, h) for l in range(2) for h in range(4))
    for row in curve:
        heads = [tuple(pair) for pair in row["heads"]]
        if scope == "global":
            assert heads == [(l, h) for _, l, h in ranked[:row["pruned"]]]
        else:  # the same number in each layer, the lowest of that layer
            per_layer = [[(l, h) for _, l, h in ranked if l == layer] for layer in range(2)]
            assert heads == per_layer[0][:row["pruned"] // 2] + per_layer[1][:row["pruned"] // 2]
        assert row["loss"] == pytest.approx(mean_loss(model, batches, prune_heads(model, heads)), abs=1e-9)
        assert row["loss_increase"] == pytest.approx(row["loss"] - curve[0]["loss"], abs=1e-12)


# --- plots, the whole analysis, the script --------------------------------------------------------------


def test_attention_plots_have_one_panel_per_head(tmp_path):
    maps = torch.softmax(torch.randn(2, 3, 10, 10), -1).tril()
    fig = plot_attention_grid(maps, tmp_path / "grid.png")
    assert len(fig.axes) == 6 and (tmp_path / "grid.png").read_bytes()[:4] == b"\x89PNG"
    fig = plot_attention_head(maps[1, 2], tmp_path / "one.png", "L1 H2", [f"t{i}$" for i in range(10)])
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()][:2] == ["t0$", "t1$"]
    assert (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def run_dir(tmp_path):
    """A run directory: a random model's checkpoint, a tiny char corpus, the config.yaml naming it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for n in range(6):
        (docs / f"{n}.txt").write_text(f"Scene {n}. Enter the king, and lords;\nWho goes there? " * 40)
    data = prepare_data(DataConfig(name="tiny", corpus="text", paths=[str(docs)], root=str(tmp_path / "data"),
                                   val_fraction=0.3, tokenizer=TokenizerConfig(type="char")))
    vocab = json.loads((data / "meta.json").read_text())["tokenizer"]["vocab_size"]
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=vocab, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=32))
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", "10", model, train_seq_len=32, step=10,
                    tokenizer_file=data / "tokenizer.json")
    (run / "config.yaml").write_text(f"data:\n  root: {tmp_path / 'data'}\n  name: tiny\n")
    return run


def test_the_data_folder_of_a_run(run_dir, tmp_path, monkeypatch):
    assert run_data_dir(resolve_checkpoint(run_dir)) == tmp_path / "data" / "tiny"
    assert run_data_dir(run_dir / "checkpoints" / "10") == tmp_path / "data" / "tiny"
    _, data = load_for_eval(run_dir, data_dir=tmp_path / "data" / "tiny")
    assert data.data_dir == tmp_path / "data" / "tiny"
    # Without config.yaml: the default DataConfig's folder, from the current directory.
    (run_dir / "config.yaml").unlink()
    monkeypatch.chdir(tmp_path)
    assert run_data_dir(run_dir / "checkpoints" / "10") == tmp_path / "data" / "shakespeare"


def test_data_of_another_tokenizer_is_refused(run_dir, tmp_path):
    """Even with a vocabulary no larger than the model's: other ids would mean other characters."""
    docs = tmp_path / "other_docs"
    docs.mkdir()
    (docs / "a.txt").write_text("zyxwvu tsrq, ponm;\n" * 200)
    (docs / "b.txt").write_text("lkjih gfed? cba!\n" * 200)
    other = prepare_data(DataConfig(name="other", corpus="text", paths=[str(docs)],
                                    root=str(tmp_path / "data"), val_fraction=0.5,
                                    tokenizer=TokenizerConfig(type="char")))
    with pytest.raises(ValueError, match="holds another tokenizer than .*checkpoints.*tokenizer.json"):
        analyze_heads(HeadAnalysisConfig(ckpt=str(run_dir), data_dir=str(other)))


def test_analyze_heads_writes_the_report_and_plots(run_dir, tmp_path, capsys):
    out = tmp_path / "out"
    report = analyze_heads(HeadAnalysisConfig(ckpt=str(run_dir), out_dir=str(out), seq_len=16, batch_size=2,
                                              n_batches=2, head=[1, 3], prune_steps=4, map_len=20))
    lines = capsys.readouterr().out.splitlines()
    on_disk = json.loads((out / "heads.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert len(on_disk["heads"]) == 8
    for record in on_disk["heads"]:
        assert {"layer", "head", "kind", "entropy", "mean_offset", "prev_token_mass", "first_token_mass",
                "delimiter_mass", "importance"} <= set(record)
        assert 0 <= record["entropy"] <= math.log(16)
    assert on_disk["pruning"][0]["pruned"] == 0 and on_disk["pruning"][0]["loss"] == on_disk["base_loss"]
    assert on_disk["pruning"][-1]["pruned"] == 8
    for name in ["attention_maps.png", "importance.png", "pruning.png", "attention_L1H3.png"]:
        assert (out / name).read_bytes()[:4] == b"\x89PNG", name
    assert any(line.startswith("| layer | head | kind") for line in lines)



def test_the_analysis_goes_beside_the_checkpoints_and_replaces_only_an_earlier_analysis(run_dir, tmp_path):
    """Never inside a checkpoint (pruning deletes it when training continues), never over another file."""
    small = dict(seq_len=16, batch_size=2, n_batches=1, prune_steps=2, map_len=8)
    analyze_heads(HeadAnalysisConfig(ckpt=str(run_dir), **small))
    assert json.loads((run_dir / "heads" / "10" / "heads.json").read_text())["step"] == 10
    assert sorted(p.name for p in (run_dir / "checkpoints" / "10").iterdir()) == [
        "config.json", "model.safetensors", "tokenizer.json"]  # nothing of the analysis inside
    analyze_heads(HeadAnalysisConfig(ckpt=str(run_dir), **small))  # an earlier analysis is ours to replace
    checkpoint = run_dir / "checkpoints" / "10"
    inside = checkpoint / "heads"
    refusal = f"analyze_heads.out_dir='{inside}' is invalid: it is inside {checkpoint}, which holds"
    with pytest.raises(ValueError, match=re.escape(refusal)):
        analyze_heads(HeadAnalysisConfig(ckpt=str(run_dir), out_dir=str(inside), **small))
    notes, figures = tmp_path / "notes", tmp_path / "figures"
    for folder in (notes, figures):
        folder.mkdir()
        (folder / "pruning.png").write_bytes(b"mine")
    (notes / "heads.json").write_text('{"mine": 1}')
    for folder, message in ((notes, f"{notes / 'heads.json'} exists and is not a head analysis"),
                            (figures, f"{figures / 'pruning.png'} exists without a head analysis")):
        with pytest.raises(ValueError, match=re.escape(f"analyze_heads.out_dir: {message}")):
            analyze_heads(HeadAnalysisConfig(ckpt=str(run_dir), out_dir=str(folder), **small))
        assert (folder / "pruning.png").read_bytes() == b"mine"
    assert (notes / "heads.json").read_text() == '{"mine": 1}'

def test_config_composes_and_the_script_reports_mistakes_in_one_line(run_dir, eval_schemas, monkeypatch):
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
            cfg = compose("analyze_heads", overrides=["ckpt=runs/x", "head=[0,1]", "importance=gradient"])
    finally:
        GlobalHydra.instance().clear()
    parsed = from_dict(HeadAnalysisConfig, OmegaConf.to_container(cfg, resolve=True), owner="analyze_heads")
    # Every other key has the dataclass's default: the YAML states none again.
    assert parsed == HeadAnalysisConfig(ckpt="runs/x", head=[0, 1], importance="gradient")
    for values, message in [
        ({"ckpt": "x", "prune_scope": "all"}, "analyze_heads.prune_scope='all' is invalid: allowed:"),
        ({}, "analyze_heads.ckpt=None is invalid: required"),
        ({"ckpt": "x", "seq_len": 2}, "analyze_heads.seq_len=2 is invalid: must be above 2"),
        ({"ckpt": "x", "head": [1]}, "analyze_heads.head=[1] is invalid: must be [layer, head]"),
        ({"ckpt": "x", "text": ""}, "analyze_heads.text='' is invalid"),
        ({"ckpt": "x", "device": "tpu"}, "analyze_heads.device='tpu' is invalid"),
    ]:
        with pytest.raises(ValueError, match=re.escape(message)):
            HeadAnalysisConfig(**values)
    monkeypatch.chdir(run_dir.parent)
    assert run_script(monkeypatch, "analyze_heads", f"ckpt={run_dir}", "head=[5,0]") == (
        "error: analyze_heads.head=[5, 0] is invalid: expected [layer, head] with 0 <= layer < 2 "
        "and 0 <= head < 4")
    assert sorted(p.name for p in run_dir.parent.iterdir()) == ["data", "docs", "run"]  # nothing littered
