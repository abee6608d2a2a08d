"""CoPE (Golovneva et al. 2024) against hand computations of its gates, positions and logits."""

from __future__ import annotations

import math
import re

import pytest
import torch
from torch.overrides import TorchFunctionMode

from nanoattn import GPT, KVCache, ModelConfig
from nanoattn.model import routes
from nanoattn.positional import REGISTRY, build_positional
from nanoattn.positional.cope import CoPEPositionalEncoding


def config(**overrides) -> ModelConfig:
    fields = dict(vocab_size=32, d_model=32, n_layer=2, n_head=4, d_ff=64, max_seq_len=16, pos="cope")
    return ModelConfig(**{**fields, **overrides})


def encoding(**overrides) -> CoPEPositionalEncoding:
    torch.manual_seed(0)
    pe = build_positional(config(**overrides))
    with torch.no_grad():
        pe.embeddings.normal_()  # unit scale, so the bias is far from 0 in every check
    return pe


def hand_bias(q, k, table, npos_max):
    """Loops over b, h, i, j: gates, contextual positions, interpolated logits (queries = keys' positions)."""
    B, H, T, D = q.shape
    groups = H // k.shape[1]
    gates, positions = torch.zeros(B, H, T, T), torch.zeros(B, H, T, T)
    bias = torch.zeros(B, H, T, T)
    for b in range(B):
        for h in range(H):
            kh = k[b, h // groups]
            for i in range(T):
                for j in range(i + 1):
                    gates[b, h, i, j] = torch.sigmoid(q[b, h, i] @ kh[j] / math.sqrt(D))
                for j in range(i + 1):
                    p = sum(gates[b, h, i, t].item() for t in range(j, i + 1))
                    positions[b, h, i, j] = p
                    p = min(p, npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    z_lo, z_hi = q[b, h, i] @ table[lo], q[b, h, i] @ table[hi]
                    bias[b, h, i, j] = ((1 - (p - lo)) * z_lo + (p - lo) * z_hi) / math.sqrt(D)
    return gates, positions, bias


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_gates_positions_and_bias_equal_a_hand_computation(n_kv_head):
    pe = encoding(n_kv_head=n_kv_head, cope_npos_max=3)  # small, so some positions are clipped
    T = 6
    q, k = torch.randn(2, 4, T, 8), torch.randn(2, n_kv_head, T, 8)
    positions = torch.arange(T)
    _, hand_positions, hand = hand_bias(q, k, pe.embeddings[0].detach(), 3)
    causal = torch.ones(T, T).tril().bool()
    p = pe.contextual_positions(q, k, positions, positions)
    torch.testing.assert_close(p * causal, hand_positions)
    assert (p[..., ~causal] == 0).all()  # keys after their query: gate 0, so position 0
    assert (hand_positions[..., causal] > 2).any()  # the clip is reached
    with torch.no_grad():
        bias = pe.bias(q, k, positions, positions, layer=0)
    assert bias.dtype == torch.float32 and bias.shape == (2, 4, T, T)
    torch.testing.assert_close(bias * causal, hand)


def test_future_keys_are_gated_out_before_the_reverse_sum():
    """A query's positions count only keys up to itself: changing later keys changes nothing."""
    pe = encoding()
    q, k = torch.randn(1, 4, 7, 8), torch.randn(1, 4, 7, 8)
    positions = torch.arange(7)
    changed = k.clone()
    changed[:, :, 4:] = 10 * torch.randn(1, 4, 3, 8)  # keys 4..6: after queries 0..3
    with torch.no_grad():
        before = pe.bias(q[:, :, :4], k, positions[:4], positions, 0)
        after = pe.bias(q[:, :, :4], changed, positions[:4], positions, 0)
    torch.testing.assert_close(before[..., :4], after[..., :4])
    # The position of the query's own key is its own gate; of key 0, the sum of all gates up to i.
    p = pe.contextual_positions(q, k, positions, positions)
    gates = torch.sigmoid(q @ k.transpose(-2, -1) / math.sqrt(8))
    torch.testing.assert_close(p.diagonal(dim1=-2, dim2=-1), gates.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(p[..., 0], (gates * torch.ones(7, 7).tril()).sum(-1))


def test_fractional_positions_interpolate_linearly_and_clip_at_npos_max(monkeypatch):
    npos = 5
    pe = encoding(cope_npos_max=npos)
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 4, 7, 8)
    fixed = torch.tensor([0.0, 0.25, 1.5, 2.0, 3.75, 4.5, 100.0])  # one query, 7 keys
    monkeypatch.setattr(pe, "_positions", lambda *args: fixed.expand(1, 4, 1, 7))
    with torch.no_grad():
        bias = pe.bias(q, k, torch.tensor([6]), torch.arange(7), 0)[0, :, 0]  # [H, 7]
    z = (q[0, :, 0] @ pe.embeddings[0].detach().T) / math.sqrt(8)  # [H, npos]: the integer positions
    expected = torch.stack([z[:, 0], 0.75 * z[:, 0] + 0.25 * z[:, 1], (z[:, 1] + z[:, 2]) / 2, z[:, 2],
                            0.25 * z[:, 3] + 0.75 * z[:, 4], z[:, 4], z[:, 4]], dim=-1)  # 4.5, 100 -> 4
    torch.testing.assert_close(bias, expected)


def test_open_gates_count_tokens_and_clip_at_npos_max():
    """Gates near 1 make p_ij = i - j + 1 (the key itself counts): token distance, clipped."""
    npos, T = 4, 9
    pe = encoding(cope_npos_max=npos)
    q = torch.full((1, 4, T, 8), 10.0)
    k = torch.full((1, 4, T, 8), 10.0)  # q.k / sqrt(8) = 283: sigmoid = 1 in float32
    positions = torch.arange(T)
    p = pe.contextual_positions(q, k, positions, positions)
    i, j = torch.meshgrid(torch.arange(T), torch.arange(T), indexing="ij")
    torch.testing.assert_close(p[0, 0], ((i - j + 1) * (j <= i)).float())
    with torch.no_grad():
        bias = pe.bias(q, k, positions, positions, 0)
    z = q[0, 0, 0] @ pe.embeddings[0].detach().T / math.sqrt(8)  # every query is the same
    clipped = (i - j + 1).clamp(0, npos - 1)
    torch.testing.assert_close(bias[0, 0][j <= i], z[clipped][j <= i])


def test_each_layer_has_its_own_table():
    pe = encoding(n_layer=3)
    assert pe.embeddings.shape == (3, 64, 8)
    q, k, positions = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), torch.arange(5)
    with torch.no_grad():
        biases = [pe.bias(q, k, positions, positions, layer) for layer in range(3)]
    assert not torch.allclose(biases[0], biases[1]) and not torch.allclose(biases[1], biases[2])
    # In a per-layer layout, only the CoPE layers get a table, indexed by their slot.
    model = GPT(config(n_layer=4, pos=["cope", "rope"]))
    cope = model.pos.for_layer(2)
    assert isinstance(cope, CoPEPositionalEncoding) and cope.layers == (0, 2)
    assert cope.embeddings.shape == (2, 64, 8) and cope.layer_slot(2) == 1
    assert not torch.equal(cope.embeddings[0], cope.embeddings[1])  # N(0, init_std), not zeros
    assert "pos.encodings.cope.embeddings" in dict(model.named_parameters())


def test_gqa_query_head_h_gates_with_kv_head_h_over_groups():
    gqa = encoding(n_kv_head=2)
    mha = encoding()
    q, k, positions = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.arange(6)
    with torch.no_grad():
        grouped = gqa.bias(q, k, positions, positions, 0)
        repeated = mha.bias(q, k.repeat_interleave(2, dim=1), positions, positions, 0)  # heads 0,1 <- 0
        torch.testing.assert_close(grouped, repeated)
        # Head 2 reads kv head 1: the same as a single-head call with that pair.
        alone = gqa.contextual_positions(q[:, 2:3], k[:, 1:2], positions, positions)
    torch.testing.assert_close(gqa.contextual_positions(q, k, positions, positions)[:, 2:3], alone)


def test_the_bias_is_float32_under_bf16_autocast():
    pe = encoding()
    q, k, positions = torch.randn(1, 4, 40, 8), torch.randn(1, 4, 40, 8), torch.arange(40)
    q, k = q.bfloat16(), k.bfloat16()
    with torch.no_grad():
        reference = pe.bias(q.float(), k.float(), positions, positions, 0)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            bias = pe.bias(q, k, positions, positions, 0)
            p = pe.contextual_positions(q, k, positions, positions)
    assert bias.dtype == p.dtype == torch.float32
    torch.testing.assert_close(bias, reference)  # float32 tolerances: no bf16 step inside
    torch.testing.assert_close(p, pe.contextual_positions(q.float(), k.float(), positions, positions))


def boosted_model(**overrides) -> GPT:
    torch.manual_seed(0)
    model = GPT(config(**overrides)).eval()
    if model.cfg.pos == "cope":
        with torch.no_grad():
            model.pos.embeddings.normal_(std=2.0)  # a bias that moves the attention weights a lot
    return model


@pytest.mark.parametrize("n_kv_head", [4, 1])
def test_chunked_queries_equal_one_chunk(monkeypatch, n_kv_head):
    model = boosted_model(n_kv_head=n_kv_head)
    idx = torch.randint(0, 32, (2, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = model(idx)
        monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 3 * 40)  # 3 queries a chunk
        chunked = model(idx)
        _, weights = model.attention_maps(idx)  # the explicit path
    torch.testing.assert_close(chunked, whole, atol=1e-5, rtol=1e-5)
    no_bias = boosted_model(n_kv_head=n_kv_head, pos="nope")
    with torch.no_grad():
        _, nope_weights = no_bias.attention_maps(idx)
    assert (weights[0] - nope_weights[0]).abs().max() > 0.05  # the bias really acts


def test_cached_decoding_is_exact_past_npos_max_and_the_training_length():
    model = boosted_model(cope_npos_max=6, n_kv_head=2)
    idx = torch.randint(0, 32, (2, 30), generator=torch.Generator().manual_seed(2))  # > max_seq_len 16
    cache = KVCache(model.cfg, batch_size=2, capacity=30)
    with torch.no_grad():
        steps = [model(idx[:, :7], cache=cache)[:, -1]]
        steps += [model(idx[:, t:t + 1], cache=cache)[:, -1] for t in range(7, 30)]
        recomputed = [model(idx[:, :t])[:, -1] for t in range(7, 31)]
    torch.testing.assert_close(torch.stack(steps), torch.stack(recomputed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("value", [1, 0, -3, 2.5, True, "64", None])
def test_bad_npos_max_is_a_one_line_error(value):
    with pytest.raises(ValueError, match=re.escape(f"model.cope_npos_max={value!r} is invalid: ")) as error:
        config(cope_npos_max=value)
    assert "\n" not in str(error.value)
    config(cope_npos_max=2)
    # Elsewhere it must still be a positive integer; CoPE's own bound (at least 2) applies only where used.
    if type(value) is int and value == 1:
        config(pos="rope", cope_npos_max=value)
    else:
        with pytest.raises(ValueError, match=re.escape(f"model.cope_npos_max={value!r} is invalid: must be a "
                                                       "positive integer")):
            config(pos="rope", cope_npos_max=value)


def test_gradients_reach_the_table_and_the_gates():
    pe = encoding(cope_npos_max=8)
    q = torch.randn(1, 4, 6, 8, requires_grad=True)
    k = torch.randn(1, 4, 6, 8, requires_grad=True)
    positions = torch.arange(6)
    causal = torch.ones(6, 6).tril().bool()
    (pe.bias(q, k, positions, positions, 1) * causal).square().sum().backward()
    assert pe.embeddings.grad[1].abs().sum() > 0 and (pe.embeddings.grad[0] == 0).all()  # only layer 1
    assert k.grad.abs().sum() > 0  # k enters only through the gates: positions are differentiable
    assert q.grad.isfinite().all()


def test_a_tiny_model_trains():
    torch.manual_seed(0)
    model = GPT(config(max_seq_len=32, n_kv_head=2))
    # A repeating pattern with a period the model must count: 0 1 2 ... 6 0 1 ...
    data = (torch.arange(25)[None] + torch.randint(0, 7, (4, 1))) % 7
    # Adam by hand: torch.optim's first optimizer imports torch._dynamo, seconds on a shared CPU.
    params = list(model.parameters())
    moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in params]
    losses = []
    for step in range(1, 21):
        loss = model.loss(data[:, :-1], data[:, 1:])
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p, (m, v) in zip(params, moments, strict=True):
                m.lerp_(p.grad, 0.1)
                v.lerp_(p.grad.square(), 0.001)
                p -= 1e-2 * (m / (1 - 0.9**step)) / ((v / (1 - 0.999**step)).sqrt() + 1e-8)
        losses.append(loss.item())
    assert math.isfinite(losses[-1]) and losses[-1] < 0.5 * losses[0]
    assert model.pos.embeddings.grad.abs().sum() > 0


class LargestTensor(TorchFunctionMode):
    """Records the element count of every tensor a torch function or tensor method returns.

    (A TorchDispatchMode would see the same tensors but imports torch._dynamo on entry: seconds.)
    """

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_the_bias_never_builds_more_than_a_chunk_at_length_2048(monkeypatch):
    length, built, largest = 2048, [], []
    original = CoPEPositionalEncoding.bias

    def spy(self, *args):
        with LargestTensor() as mode:
            bias = original(self, *args)
        built.append(bias.numel())
        largest.append(mode.largest)
        return bias

    monkeypatch.setattr(CoPEPositionalEncoding, "bias", spy)
    torch.manual_seed(0)
    model = GPT(config(n_layer=1, d_model=16, n_head=2, max_seq_len=64)).eval()  # [2, T, T]: 2 chunks
    with torch.no_grad():
        model(torch.randint(0, 32, (1, length)))
    materialised = model.cfg.n_head * length * length
    assert len(built) > 1 and max(largest) <= routes.MASK_CHUNK_ELEMENTS < materialised
    assert max(largest) >= max(built)  # the spy sees the [B, H, Tq, Tk] intermediates


def test_registered():
    assert REGISTRY["cope"] is CoPEPositionalEncoding and CoPEPositionalEncoding.adds_bias
