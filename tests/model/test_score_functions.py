"""Stick-breaking and sigmoid attention (``attn_fn``) and FoX's forget gate (``forget_gate``).

References: each paper's equations written out per batch, head, query and key in float64 (Tan et al.
2025 for stick-breaking, Ramapuram et al. 2024 for sigmoid, Lin et al. 2025 for FoX), through the
chunked path (a few queries a chunk) and the slow path's weights; x-transformers' ``Attend`` with
``sigmoid=True`` and its ``DataDependentAlibi`` (FoX's decay) on the same q, k, v and gate weights.
Cached decoding over the registry's rows is in test_generate.py, head analysis in test_heads.py.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from x_transformers.attend import Attend
from x_transformers.x_transformers import DataDependentAlibi

from nanoattn import GPT, KVCache, ModelConfig
from nanoattn.config.model import ATTN_FNS
from nanoattn.model import Attention
from nanoattn.model import attention as attention_module
from nanoattn.model.score_functions import SCORE_FUNCTIONS
from nanoattn.positional import alibi_slopes, build_positional

T = 12


def layer(n_kv_head: int = 4, seed: int = 0, **fields) -> tuple[Attention, ModelConfig]:
    """One attention layer (d_model 32, 4 heads of 8) with weights large enough that scores and gates
    spread over several units."""
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, max_seq_len=T, **{"pos": "nope", **fields})
    attn = Attention(cfg).eval()
    with torch.no_grad():
        for p in attn.parameters():
            p.normal_(0, 0.3)
    return attn, cfg


@torch.no_grad()
def heads64(attn: Attention, x: torch.Tensor):
    """q [B, T, H, D], k, v [B, T, Hkv, D] in float64 from the fused QKV weight, without positions."""
    H, Hkv, D = attn.n_head, attn.n_kv_head, attn.head_dim
    q_w, k_w, v_w = attn.qkv.weight.double().split([H * D, Hkv * D, Hkv * D])
    B, T, _ = x.shape
    x = x.double()
    return (x @ q_w.T).view(B, T, H, D), (x @ k_w.T).view(B, T, Hkv, D), (x @ v_w.T).view(B, T, Hkv, D)


@torch.no_grad()
def reference(attn: Attention, x: torch.Tensor, weigh, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Loops over batch, head and query: s_ij = q_i.k_j / sqrt(d) (+ bias[h, i, j]), the query's row
    of weights ``weigh(s_i, b, h, i)`` (a list over the keys), the heads' outputs concatenated and
    projected by W_O. -> (output [B, T, d_model], weights [B, H, T, T]), float64."""
    q, k, v = heads64(attn, x)
    B, T, H, D = q.shape
    group = H // k.shape[2]
    bias = torch.zeros(H, T, T) if bias is None else bias
    weights = torch.zeros(B, H, T, T, dtype=torch.float64)
    out = torch.zeros(B, T, H, D, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            g = h // group  # query head h reads K/V head h // group
            for i in range(T):
                s = [float(q[b, i, h] @ k[b, j, g]) / math.sqrt(D) + float(bias[h, i, j]) for j in range(T)]
                for j, a in enumerate(weigh(s, b, h, i)):
                    weights[b, h, i, j] = a
                    out[b, i, h] += a * v[b, j, g]
    return out.reshape(B, T, H * D) @ attn.proj.weight.double().T, weights


def sigmoid(z: float) -> float:
    return 1 / (1 + math.exp(-z))


def stick_breaking_row(window=None):
    """Tan et al. 2025: over the keys j < i (within the window: i - j < window),
    A_ij = beta_ij * prod_{j<k<i} (1 - beta_ik), beta = sigma(s)."""
    def weigh(s, b, h, i):
        keys = [j for j in range(i) if window is None or i - j < window]
        return [sigmoid(s[j]) * math.prod(1 - sigmoid(s[k]) for k in keys if k > j) if j in keys else 0.0
                for j in range(len(s))]
    return weigh


def sigmoid_row(n: int):
    """Ramapuram et al. 2024: A_ij = sigma(s_ij - log n) over the keys j <= i."""
    return lambda s, b, h, i: [sigmoid(s[j] - math.log(n)) if j <= i else 0.0 for j in range(len(s))]


def forget_gate_row(log_f: torch.Tensor):
    """Lin et al. 2025: softmax over the keys j <= i of s_ij + sum_{t=j+1..i} log f_t, with log f
    [B, T, H] of each batch row, token and head."""
    def weigh(s, b, h, i):
        logits = [s[j] + sum(float(log_f[b, t, h]) for t in range(j + 1, i + 1)) for j in range(i + 1)]
        top = max(logits)
        e = [math.exp(z - top) for z in logits]
        return [e[j] / sum(e) if j <= i else 0.0 for j in range(len(s))]
    return weigh


def ours(attn: Attention, cfg: ModelConfig, x: torch.Tensor, monkeypatch):
    """(the fast path's output in chunks of 5 queries, the slow path's weights)."""
    monkeypatch.setattr(attention_module, "MASK_CHUNK_ELEMENTS", x.shape[0] * cfg.n_head * 5 * T)
    pe, positions = build_positional(cfg), torch.arange(T)
    with torch.no_grad():
        fast = attn(x, pe, positions, T)[0]
        slow, weights = attn(x, pe, positions, T, return_weights=True)
    torch.testing.assert_close(slow, fast, atol=1e-5, rtol=1e-5)
    return fast, weights


def test_the_registry_of_score_functions_is_the_configs_choice():
    assert tuple(SCORE_FUNCTIONS) == ATTN_FNS


def alibi(pos: str):
    """ALiBi's bias [H, T, T], -slope_h (i - j), or None for NoPE."""
    i = torch.arange(T)
    slopes = torch.tensor(alibi_slopes(4))[:, None, None]
    return None if pos == "nope" else -slopes * (i[:, None] - i[None, :])


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize(("pos", "window"), [("nope", None), ("alibi", None), ("nope", 5)])
def test_stick_breaking_equals_the_papers_formula(monkeypatch, n_kv_head, pos, window):
    attn, cfg = layer(n_kv_head, attn_fn="stick_breaking", pos=pos, sliding_window=window)
    x = torch.randn(2, T, 32)
    expected, expected_weights = reference(attn, x, stick_breaking_row(window), alibi(pos))
    got, weights = ours(attn, cfg, x, monkeypatch)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.double(), expected_weights, atol=1e-6, rtol=1e-5)
    assert (weights[:, :, 0] == 0).all() and (weights.diagonal(dim1=-2, dim2=-1) == 0).all()  # earlier keys
    left = 1 - expected_weights.sum(-1)[:, :, 1:]  # the stick left over: some rows keep much of it
    assert 0.05 < left.mean() < 0.95 and left.max() > 0.5


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("pos", ["nope", "alibi"])
def test_sigmoid_attention_equals_the_papers_formula_with_b_minus_log_n(monkeypatch, n_kv_head, pos):
    attn, cfg = layer(n_kv_head, attn_fn="sigmoid", pos=pos)
    assert attn.score_fn.bias == -math.log(T)  # n: the training length, max_seq_len
    x = torch.randn(2, T, 32)
    expected, expected_weights = reference(attn, x, sigmoid_row(T), alibi(pos))
    got, weights = ours(attn, cfg, x, monkeypatch)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.double(), expected_weights, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("pos", ["nope", "alibi"])
def test_forget_gate_equals_the_papers_formula(monkeypatch, n_kv_head, pos):
    attn, cfg = layer(n_kv_head, forget_gate=True, pos=pos)
    x = torch.randn(2, T, 32)
    gate = attn.forget_gate.proj
    with torch.no_grad():
        log_f = F.logsigmoid(x.double() @ gate.weight.double().T + gate.bias.double())  # [B, T, H]
    assert log_f.std() > 0.2  # the gates decay, each token and head its own
    expected, expected_weights = reference(attn, x, forget_gate_row(log_f), alibi(pos))
    got, weights = ours(attn, cfg, x, monkeypatch)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.double(), expected_weights, atol=1e-6, rtol=1e-5)


def test_the_forget_gate_is_a_linear_layer_with_a_bias_from_zero_as_foxs():
    """FoX's data-dependent gate (``fgate_type='full'``): nn.Linear(d_model, n_head) with a bias, drawn
    as every linear layer (zero bias: gates start near 1/2), whatever the model's ``bias``."""
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=4, n_kv_head=2, pos="nope", forget_gate=True))
    gate = model.blocks[0].attn.forget_gate.proj
    assert gate.weight.shape == (4, 32) and (gate.bias == 0).all() and not model.cfg.bias
    assert gate.weight.std().item() == pytest.approx(model.cfg.init_std, rel=0.3)


def projected(attn: Attention, x: torch.Tensor):
    """q [B, H, T, D], k, v [B, Hkv, T, D] as our layer makes them (NoPE)."""
    B, H, Hkv, D = x.shape[0], attn.n_head, attn.n_kv_head, attn.head_dim
    heads = attn.qkv(x).view(B, T, H + 2 * Hkv, D).transpose(1, 2)
    return heads.split([H, Hkv, Hkv], dim=1)


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_sigmoid_attention_equals_x_transformers_sigmoid_attend_given_the_bias(n_kv_head):
    """x-transformers' ``Attend(sigmoid=True)`` is sigma(s) with no bias of its own: the paper's b goes
    in as its ``attn_bias``. (Its GQA repeats K/V heads as (r kvh), query head h reading head
    h % n_kv_head where we read h // group: compared at MHA and MQA, where both agree.)"""
    attn, cfg = layer(n_kv_head, attn_fn="sigmoid")
    x = torch.randn(2, T, 32)
    with torch.no_grad():
        q, k, v = projected(attn, x)
        positions = torch.arange(T)
        got = attn._attend(q, k, v, positions, positions, build_positional(cfg), 0)
        theirs = Attend(causal=True, sigmoid=True)(q, k, v, attn_bias=torch.full((T, T), -math.log(T)))[0]
    torch.testing.assert_close(got, theirs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_forget_gate_equals_x_transformers_data_dependent_alibi(n_kv_head):
    """x-transformers' ``DataDependentAlibi`` (FoX's decay as a bias, "b h i j") with our gate's
    weights, fed to its softmax ``Attend``. It starts the gate's bias at 5 (gates near 1) where FoX
    and we start it at 0; the weights are copied, so the function is the same."""
    attn, cfg = layer(n_kv_head, forget_gate=True)
    dda = DataDependentAlibi(32, 4)
    with torch.no_grad():
        dda.to_forget_gates[0].weight.copy_(attn.forget_gate.proj.weight)
        dda.to_forget_gates[0].bias.copy_(attn.forget_gate.proj.bias)
        x = torch.randn(2, T, 32)
        got = attn(x, build_positional(cfg), torch.arange(T), T)[0]
        q, k, v = projected(attn, x)
        y = Attend(causal=True)(q, k, v, attn_bias=dda(x))[0]  # [B, H, T, D]
        theirs = attn.proj(y.transpose(1, 2).reshape(2, T, 32))
    torch.testing.assert_close(got, theirs, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("fields", [dict(attn_fn="stick_breaking"), dict(attn_fn="sigmoid"),
                                    dict(forget_gate=True)], ids=["stick_breaking", "sigmoid", "fox"])
def test_evaluation_at_a_long_length_builds_one_chunk_of_scores_at_a_time(monkeypatch, fields):
    """Memory linear in T: no score, weight or bias tensor is larger than MASK_CHUNK_ELEMENTS."""
    built = []
    explicit, mask = attention_module.Attention._attend_explicit, attention_module.Attention._mask

    def spy_explicit(self, *args):
        y, weights = explicit(self, *args)
        built.append(weights.numel())
        return y, weights

    def spy_mask(self, *args):
        out = mask(self, *args)
        built.append(out.numel())
        return out

    monkeypatch.setattr(attention_module.Attention, "_attend_explicit", spy_explicit)
    monkeypatch.setattr(attention_module.Attention, "_mask", spy_mask)
    monkeypatch.setattr(attention_module, "MASK_CHUNK_ELEMENTS", 1 << 16)
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, pos="nope", **fields)
    with torch.no_grad():
        GPT(cfg).eval()(torch.randint(0, 50, (1, 1024)))
    assert max(built) <= 1 << 16  # the whole [4 heads, 1024, 1024] would be 64x that
    assert len(built) >= 1024 // ((1 << 16) // (4 * 1024))  # a mask (and weights) per chunk of 16 queries


@pytest.mark.parametrize("fields", [dict(attn_fn="stick_breaking"), dict(attn_fn="sigmoid"),
                                    dict(forget_gate=True)], ids=["stick_breaking", "sigmoid", "fox"])
def test_bf16_autocast_stays_as_close_to_float32_as_the_plain_block(fields):
    """Under bf16 autocast (the scores in bf16 up to 512 keys on CPU), the logits stay within bf16
    rounding: their error against float32 at most twice the plain block's. Stick-breaking sums its
    logs in float32 and FoX keeps its gates' sums in float32."""
    errors = []
    for variant in ({}, fields):
        torch.manual_seed(0)
        model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=128,
                                pos="nope", init_std=0.1, **variant)).eval()
        idx = torch.randint(0, 64, (2, 128), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            exact = model(idx)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                rounded = model(idx).float()
        errors.append((rounded - exact).abs().max().item())
    assert errors[1] <= 2 * errors[0] + 1e-3


def test_the_kv_cache_keeps_each_tokens_log_gates_beside_its_keys_and_values():
    cfg = ModelConfig(d_model=32, n_layer=3, n_head=4, n_kv_head=2, pos="nope", forget_gate=True,
                      sliding_window=[8, None, None])
    cache = KVCache(cfg, 2, 40, dtype=torch.bfloat16)
    # Per token and sequence: K and V of 2 heads x 8 in bf16, and 4 float32 log gates, in each layer.
    assert cache.bytes_per_token() == 2 * 3 * (2 * 2 * 8 * 2 + 4 * 4)
    assert cache.nbytes == 2 * (7 + 40 + 40) * (2 * 2 * 8 * 2 + 4 * 4)  # the local layer holds 7 slots
    plain = KVCache(ModelConfig(**{**cfg.to_dict(), "forget_gate": False}), 2, 40, dtype=torch.bfloat16)
    assert plain.bytes_per_token() == 2 * 3 * 2 * 2 * 8 * 2 and plain.log_gates == []


@pytest.mark.parametrize(("fields", "message"), [
    (dict(attn_fn="relu"), "^model.attn_fn='relu' is invalid: allowed: softmax | stick_breaking | sigmoid$"),
    (dict(attn_fn=None), "^model.attn_fn=None is invalid: allowed: softmax"),
    (dict(forget_gate="yes"), "^model.forget_gate='yes' is invalid: must be true or false$"),
    (dict(forget_gate=1), "^model.forget_gate=1 is invalid: must be true or false$"),
    (dict(attn_fn="sigmoid", attn_sinks=True),
     "^model.attn_fn='sigmoid' is invalid: cannot be combined with attn_sinks=True: a sink is one more "
     "column of a softmax"),
    (dict(attn_fn="stick_breaking", attn_sinks=True),
     "^model.attn_fn='stick_breaking' is invalid: cannot be combined with attn_sinks=True"),
    (dict(attn_fn="stick_breaking", diff_attn=True),
     "^model.attn_fn='stick_breaking' is invalid: cannot be combined with diff_attn=True: differential "
     "attention subtracts two softmax maps$"),
    (dict(forget_gate=True, diff_attn=True),
     "^model.forget_gate=True is invalid: cannot be combined with diff_attn=True: a gate per query head"),
])
def test_bad_or_undefined_settings_are_one_line_errors_naming_both_fields(fields, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|")) as info:
        ModelConfig(**{"d_model": 32, "n_head": 4, "n_kv_head": 2, "pos": "nope", **fields})
    assert "\n" not in str(info.value)
