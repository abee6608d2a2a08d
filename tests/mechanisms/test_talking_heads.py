"""Talking-heads attention (``nanoattn/mechanisms/talking_heads.py``) against the paper's equations
written out head by head in float64 and against x-transformers' ``Attend`` with its talking heads;
its start as plain attention, its statistic and its refusal beside differential attention. Cached
decoding, chunked against explicit scores, head analysis and a lab row run over the registry's rows
in the generic tests (tests/variants.py)."""

import math

import pytest
import torch
from x_transformers.attend import Attend

from nanoattn import GPT, ModelConfig
from nanoattn.eval.variant_heads import own_statistic, variant_statistics
from nanoattn.model import Attention
from nanoattn.positional import build_positional

H, HKV, T, D = 4, 2, 10, 8


def mixed(seed: int) -> tuple[Attention, object]:
    """A GQA layer with talking heads whose mixes are drawn off the identity, and its encoding (NoPE)."""
    cfg = ModelConfig(d_model=H * D, n_head=H, n_kv_head=HKV, pos="nope", talking_heads=True)
    attn = Attention(cfg)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mix in (attn.talking_heads.logits_mix, attn.talking_heads.weights_mix):
            mix.copy_(torch.eye(H) + 0.5 * torch.randn(H, H, generator=generator))
    return attn, build_positional(cfg)


def heads_written_out(q, k, v, logits_mix, weights_mix):
    """The paper's equations, one head at a time: J_g = q_g k_g^T / sqrt(d) (k_g of g's K/V group),
    L_h = sum_g P_l[g, h] J_g, causal W_h = softmax(L_h), U_h = sum_g P_w[g, h] W_g, O_h = U_h v_h."""
    q, k, v, logits_mix, weights_mix = (t.double() for t in (q, k, v, logits_mix, weights_mix))
    group = H // HKV
    J = [q[:, g] @ k[:, g // group].transpose(-1, -2) / math.sqrt(D) for g in range(H)]
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    W = [torch.softmax(sum(logits_mix[g, h] * J[g] for g in range(H)).masked_fill(future, -math.inf), -1)
         for h in range(H)]
    U = [sum(weights_mix[g, h] * W[g] for g in range(H)) for h in range(H)]
    return torch.stack([U[h] @ v[:, h // group] for h in range(H)], 1), torch.stack(U, 1)


@pytest.mark.parametrize("return_weights", [False, True])
def test_its_outputs_and_weights_are_the_papers_equations(return_weights):
    attn, pe = mixed(seed=0)
    q, k, v = torch.randn(2, H, T, D), torch.randn(2, HKV, T, D), torch.randn(2, HKV, T, D)
    positions = torch.arange(T)
    y, weights = attn.attend_heads(q, k, v, positions, positions, pe, 0, return_weights)
    expected, expected_weights = heads_written_out(q, k, v, attn.talking_heads.logits_mix,
                                                   attn.talking_heads.weights_mix)
    torch.testing.assert_close(y.double(), expected, atol=1e-5, rtol=1e-5)
    if return_weights:
        torch.testing.assert_close(weights.double(), expected_weights, atol=1e-6, rtol=1e-6)


def test_it_is_x_transformers_talking_heads():
    """x-transformers mixes the logits as sim + W_pre sim (a residual 1x1 convolution over heads) and the
    weights as W_post attn, before any bias: P_l = I + W_pre^T and P_w = W_post^T in our terms."""
    attn, pe = mixed(seed=1)
    theirs = Attend(causal=True, heads=H, pre_talking_heads=True, post_talking_heads=True)
    with torch.no_grad():
        theirs.pre_softmax_talking_heads.weight.copy_(
            (attn.talking_heads.logits_mix - torch.eye(H)).T[:, :, None, None])
        theirs.post_softmax_talking_heads.weight.copy_(attn.talking_heads.weights_mix.T[:, :, None, None])
    q, k, v = torch.randn(2, H, T, D), torch.randn(2, H, T, D), torch.randn(2, H, T, D)
    group = torch.arange(0, H, H // HKV)
    k, v = k[:, group].repeat_interleave(H // HKV, 1), v[:, group].repeat_interleave(H // HKV, 1)
    positions = torch.arange(T)
    ours, _ = attn.attend_heads(q, k[:, ::H // HKV], v[:, ::H // HKV], positions, positions, pe, 0)
    expected, _ = theirs(q, k, v)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)


def test_it_starts_as_plain_attention():
    """P_l = P_w = I at the start: the same weights give plain attention's outputs."""
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    torch.manual_seed(0)
    talking = GPT(ModelConfig(**fields, talking_heads=True)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    missing, unexpected = plain.load_state_dict(talking.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == [f"blocks.{i}.attn.talking_heads.{mix}" for i in range(2)
                                                  for mix in ("logits_mix", "weights_mix")]
    idx = torch.randint(0, 40, (2, 12))
    with torch.no_grad():
        torch.testing.assert_close(talking(idx), plain(idx), atol=1e-5, rtol=1e-5)


def test_its_statistic_is_the_share_of_each_mix_off_its_own_head():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=40, d_model=32, n_layer=2, n_head=4, max_seq_len=16,
                            talking_heads=True)).eval()
    with torch.no_grad():
        model.blocks[0].attn.talking_heads.logits_mix.copy_(torch.full((4, 4), -0.5).fill_diagonal_(1.5))
    batches = [(torch.randint(0, 40, (2, 16)), None)]
    stats = variant_statistics(model, batches)["talking_heads"]
    assert stats["logits"][0] == pytest.approx([0.5] * 4)  # 3 * 0.5 of 3 * 0.5 + 1.5 off the diagonal
    assert stats["logits"][1] == stats["weights"][0] == [0.0] * 4
    assert own_statistic(model, batches) == ("share mixed", pytest.approx(0.5 / 4))


def test_it_is_refused_beside_differential_attention_in_one_line():
    with pytest.raises(ValueError, match=r"^model\.talking_heads=True is invalid: cannot be combined with "
                                         r"diff_attn=True: it mixes the scores of all heads[^\n]*$"):
        ModelConfig(d_model=32, n_head=4, diff_attn=True, talking_heads=True)
