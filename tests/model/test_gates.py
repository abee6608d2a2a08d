"""The pieces around the softmax (``nanoattn/model/gates.py``): output gates, Scalable-Softmax,
exclusive self-attention and canon layers.

References: each paper's equation written out per head in float64 (no positions, so only the
variant is tested; the generic tests run them with every encoding), transformers' Qwen3-Next
attention and x-transformers' gated values for the gate, a depthwise ``nn.Conv1d`` as the canon
reference code computes it, and token shift as canon's width-2 case. Cached decoding, head
analysis and learning run over the registry's rows in the generic tests (tests/variants.py).
"""

import math

import pytest
import torch
from transformers import Qwen3NextConfig
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextAttention, Qwen3NextRotaryEmbedding
from x_transformers.x_transformers import Attention as XAttention

from nanoattn import GPT, ModelConfig, generate
from nanoattn.model import Attention
from nanoattn.model import attention as attention_module
from nanoattn.model.gates import Canon
from nanoattn.model.gpt import shift_tokens
from nanoattn.positional import build_positional

T, D = 12, 8  # tokens, head_dim


def run(attn: Attention, cfg: ModelConfig, x: torch.Tensor, **options):
    positions = torch.arange(x.shape[1])
    with torch.no_grad():
        return attn(x, build_positional(cfg), positions, x.shape[1], **options)


def heads_of(attn: Attention, x: torch.Tensor):
    """q [B, H, T, D], k and v [B, H, T, D] (each K/V head repeated for its group) in float64."""
    H, Hkv = attn.n_head, attn.n_kv_head
    q, k, v = (x.double() @ attn.qkv.weight.double().T).split([H * D, Hkv * D, Hkv * D], dim=-1)
    q, k, v = (t.view(x.shape[0], x.shape[1], -1, D).transpose(1, 2) for t in (q, k, v))
    return q, k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)


def project(attn: Attention, heads: torch.Tensor) -> torch.Tensor:
    """Heads [B, H, T, D] concatenated and multiplied by W_O."""
    B, H, T_, _ = heads.shape
    return heads.transpose(1, 2).reshape(B, T_, H * D) @ attn.proj.weight.double().T


def causal_softmax(scores: torch.Tensor) -> torch.Tensor:
    future = torch.ones(scores.shape[-1], scores.shape[-1], dtype=torch.bool).triu(1)
    return torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)


# --- gated attention --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("mode", ["headwise", "elementwise"])
def test_the_gate_is_sigmoid_of_x_w_on_each_heads_output_before_w_o(mode, n_kv_head):
    """Qiu et al. 2025, G1: Y' = Y * sigmoid(X W_theta), X the normalised input, Y the SDPA output,
    one score per head (headwise) or per channel (elementwise)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, pos="nope", attn_gate=mode)
    attn = Attention(cfg).eval()
    assert attn.output_gate.proj.weight.shape == ((4, 32) if mode == "headwise" else (32, 32))
    x = torch.randn(2, T, 32)
    q, k, v = heads_of(attn, x)
    y = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(D)) @ v  # [B, H, T, D]
    scores = torch.sigmoid(x.double() @ attn.output_gate.proj.weight.double().T)  # [B, T, 4 or 32]
    gate = scores.view(2, T, 4, -1).transpose(1, 2)  # [B, H, T, 1 or D]
    torch.testing.assert_close(run(attn, cfg, x)[0].double(), project(attn, y * gate), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_the_elementwise_gate_equals_transformers_qwen3_next_attention(n_kv_head):
    """Qwen3-Next computes our elementwise gate with QK-norm before RoPE. Conventions that differ:
    its q_proj holds each head's query rows then its gate rows ([q_h | g_h], h = 0, 1, ...), ours
    the fused QKV and a separate W_g; its RMSNorm gains are stored as 1 + w (w from 0)."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, n_head=4, n_kv_head=n_kv_head, max_seq_len=24, qk_norm="before_rope",
                      attn_gate="elementwise", norm_eps=1e-6)
    ours = Attention(cfg).eval()
    hf = Qwen3NextConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=n_kv_head, head_dim=16,
                         num_hidden_layers=1, layer_types=["full_attention"], max_position_embeddings=24,
                         rms_norm_eps=1e-6, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 1.0})
    hf._attn_implementation = "eager"
    theirs = Qwen3NextAttention(hf, layer_idx=0).eval()
    q, k, v = ours.qkv.weight.split([64, 16 * n_kv_head, 16 * n_kv_head])
    gate = ours.output_gate.proj.weight
    with torch.no_grad():
        for norm in (ours.qk_norm.q, ours.qk_norm.k):
            norm.weight.add_(torch.randn(16) * 0.3)  # gains off 1, so the convention shows
        theirs.q_proj.weight.copy_(torch.cat([w[16 * h:16 * (h + 1)] for h in range(4) for w in (q, gate)]))
        theirs.k_proj.weight.copy_(k)
        theirs.v_proj.weight.copy_(v)
        theirs.o_proj.weight.copy_(ours.proj.weight)
        theirs.q_norm.weight.copy_(ours.qk_norm.q.weight - 1)
        theirs.k_norm.weight.copy_(ours.qk_norm.k.weight - 1)
        x = torch.randn(2, 24, 64)
        cos_sin = Qwen3NextRotaryEmbedding(hf)(x, torch.arange(24)[None])
        causal = torch.full((24, 24), float("-inf")).triu(1)[None, None]
        expected = theirs(x, position_embeddings=cos_sin, attention_mask=causal)[0]
    torch.testing.assert_close(run(ours, cfg, x)[0], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
@pytest.mark.parametrize("mode", ["headwise", "elementwise"])
def test_the_gate_equals_x_transformers_gated_values(mode, n_kv_head):
    """x-transformers' ``gate_values=True`` (``gate_values_headwise`` for one gate per head). Conventions
    that differ: its W_g starts at zero (every gate 0.5); with GQA its query head i reads K/V head
    i mod n_kv_head where ours reads i // (n_head / n_kv_head), so our heads are permuted into its order
    (queries, gates and W_O's columns alike)."""
    torch.manual_seed(0)
    H, group = 4, 4 // n_kv_head
    cfg = ModelConfig(d_model=64, n_head=H, n_kv_head=n_kv_head, pos="nope", attn_gate=mode)
    ours = Attention(cfg).eval()
    theirs = XAttention(dim=64, dim_head=16, heads=H, kv_heads=n_kv_head, causal=True, gate_values=True,
                        gate_values_headwise=mode == "headwise").eval()
    ours_of = [(i % n_kv_head) * group + i // n_kv_head for i in range(H)]  # their head i: our ours_of[i]
    rows = lambda w, width: torch.cat([w[width * h:width * (h + 1)] for h in ours_of])  # noqa: E731
    q, k, v = ours.qkv.weight.split([64, 16 * n_kv_head, 16 * n_kv_head])
    gate = ours.output_gate.proj.weight
    with torch.no_grad():
        theirs.to_q.weight.copy_(rows(q, 16))
        theirs.to_k.weight.copy_(k)
        theirs.to_v.weight.copy_(v)
        theirs.to_v_gate.weight.copy_(rows(gate, 1 if mode == "headwise" else 16))
        theirs.to_out.weight.copy_(rows(ours.proj.weight.T, 16).T)
        x = torch.randn(2, T, 64)
        expected = theirs(x)
    torch.testing.assert_close(run(ours, cfg, x)[0], expected, atol=1e-5, rtol=1e-5)


# --- Scalable-Softmax -------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_ssmax_is_softmax_with_base_n_over_the_keys_each_query_sees(n_kv_head, window):
    """Nakanishi 2025, eq. (2): z_i -> n^(s z_i) / sum_j n^(s z_j), z the query's logits q.k / sqrt(d),
    n the number of its keys (i + 1, or the window), s learned per head; maps and outputs."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, pos="nope", ssmax=True,
                      sliding_window=window, max_seq_len=16)
    attn = Attention(cfg).eval()
    assert torch.allclose(attn.ssmax.s, torch.full((4,), 1 / math.log(16)))  # 1 at the training length
    with torch.no_grad():
        attn.ssmax.s.copy_(torch.tensor([0.2, 0.5, 1.0, 2.0]))
    x = torch.randn(2, T, 32)
    q, k, v = heads_of(attn, x)
    z = q @ k.transpose(-2, -1) / math.sqrt(D)  # [B, H, T, T]
    maps = torch.zeros_like(z)
    for i in range(T):
        first = 0 if window is None else max(0, i - window + 1)
        n = i + 1 - first
        powers = n ** (attn.ssmax.s.double().view(1, 4, 1) * z[:, :, i, first:i + 1])  # [B, H, n]
        maps[:, :, i, first:i + 1] = powers / powers.sum(-1, keepdim=True)
    got, weights = run(attn, cfg, x, return_weights=True)
    torch.testing.assert_close(weights.double(), maps, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.double(), project(attn, maps @ v), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(run(attn, cfg, x)[0], got, atol=1e-5, rtol=1e-5)  # the fast path


# --- exclusive self-attention -----------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_xsa_takes_out_each_outputs_projection_on_the_tokens_own_value(n_kv_head):
    """Zhai 2026: z_i = y_i - (y_i . v_i / |v_i|^2) v_i per head, v_i the token's value in the head's
    K/V group; z_i is orthogonal to v_i and the maps are those of plain attention."""
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=n_kv_head, pos="nope", xsa=True)
    attn = Attention(cfg).eval()
    x = torch.randn(2, T, 32)
    q, k, v = heads_of(attn, x)
    maps = causal_softmax(q @ k.transpose(-2, -1) / math.sqrt(D))
    y = maps @ v  # [B, H, T, D]
    z = y - (y * v).sum(-1, keepdim=True) / (v * v).sum(-1, keepdim=True) * v
    assert (z * v).sum(-1).abs().max() < 1e-12
    got, weights = run(attn, cfg, x, return_weights=True)
    torch.testing.assert_close(weights.double(), maps, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got.double(), project(attn, z), atol=1e-5, rtol=1e-5)
    assert (project(attn, y) - got.double()).abs().max() > 1e-2  # the exclusion changed the output


# --- canon layers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("width", [2, 4])
def test_canon_is_the_reference_depthwise_causal_convolution_with_a_residual(width):
    """Allen-Zhu's reference (PhysicsLM4, ``ShortConvolution`` without its CUDA kernel): a depthwise
    ``nn.Conv1d`` padded by width - 1 on both sides, cut to the first T outputs, plus the input."""
    torch.manual_seed(0)
    canon = Canon(ModelConfig(d_model=16, canon=width), layer=0)
    reference = torch.nn.Conv1d(16, 16, width, groups=16, padding=width - 1, bias=False)
    with torch.no_grad():
        reference.weight.copy_(canon.weight[:, None, :])
        x = torch.randn(2, T, 16)
        expected = x + reference(x.transpose(1, 2))[..., :T].transpose(1, 2)
        torch.testing.assert_close(canon(x), expected)


def test_token_shift_is_canon_of_width_2_with_one_gate():
    """e_t + g * e_{t-1}: a current tap of 0 and a previous tap g (taps in nn.Conv1d's order)."""
    canon = Canon(ModelConfig(d_model=16, canon=2), layer=0)
    gate = torch.randn(16)
    with torch.no_grad():
        canon.weight.copy_(torch.stack([gate, torch.zeros(16)], dim=1))
        e = torch.randn(2, T, 16)
        torch.testing.assert_close(canon(e), shift_tokens(e, gate))


def test_canon_acts_on_the_normalised_input_of_every_attention_block():
    """The plain model with the reference convolution hooked onto each attention's input computes the
    canon model's logits from the same weights."""
    torch.manual_seed(0)
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    canon = GPT(ModelConfig(**fields, canon=3)).eval()
    plain = GPT(ModelConfig(**fields)).eval()
    missing, unexpected = plain.load_state_dict(canon.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == ["blocks.0.canon.weight", "blocks.1.canon.weight"]

    def convolved(weight):
        def hook(module, args, kwargs):
            h = args[0]
            padded = torch.nn.functional.pad(h.transpose(1, 2), (2, 0))  # [B, D, 2 + T]
            mixed = torch.nn.functional.conv1d(padded, weight[:, None, :], groups=32).transpose(1, 2)
            return (h + mixed, *args[1:]), kwargs
        return hook

    for block, ours in zip(plain.blocks, canon.blocks, strict=True):
        block.attn.register_forward_pre_hook(convolved(ours.canon.weight.detach()), with_kwargs=True)
    idx = torch.randint(0, 40, (2, 16))
    with torch.no_grad():
        torch.testing.assert_close(canon(idx), plain(idx))


def test_canon_decodes_exactly_from_a_prompt_shorter_than_its_width():
    """The cache's first inputs are the zeros before the sequence, then the tokens as they come."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=1, max_seq_len=8,
                            canon=4, init_std=0.1)).eval()
    idx = torch.randint(0, 64, (2, 1))
    assert torch.equal(generate(model, idx, 20, temperature=0), generate(model, idx, 20, temperature=0,
                                                                         use_cache=False))


# --- all four -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fields", [dict(attn_gate="headwise"), dict(ssmax=True), dict(xsa=True),
                                    dict(canon=4)], ids=["gate", "ssmax", "xsa", "canon"])
def test_each_keeps_sdpas_causal_kernel_so_memory_stays_linear_in_the_length(monkeypatch, fields):
    """A long input goes through SDPA's causal kernel, no mask or [T, T] scores built."""
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, is_causal=False, **options):
        calls.append((q.shape[2], attn_mask is None, is_causal))
        return sdpa(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **options)

    monkeypatch.setattr(attention_module.F, "scaled_dot_product_attention", spy)
    model = GPT(ModelConfig(vocab_size=50, d_model=32, n_layer=2, n_head=4, n_kv_head=2, **fields)).eval()
    with torch.no_grad():
        model(torch.randint(0, 50, (1, 2048)))
    assert calls == [(2048, True, True)] * 2


# --- configuration ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("fields", "message"), [
    (dict(attn_gate="gelu"), "model.attn_gate='gelu' is invalid: allowed: none | headwise | elementwise$"),
    (dict(attn_gate=True), "model.attn_gate=True is invalid: allowed"),
    (dict(ssmax="yes"), "model.ssmax='yes' is invalid: must be true or false"),
    (dict(xsa=1), "model.xsa=1 is invalid: must be true or false"),
    (dict(canon=1), "model.canon=1 is invalid: must be 0 .off. or a convolution width of at least 2"),
    (dict(canon=-2), "model.canon=-2 is invalid"),
    (dict(canon=True), "model.canon=True is invalid"),
    (dict(canon=2.5), "model.canon=2.5 is invalid"),
    (dict(xsa=True, diff_attn=True), "model.xsa=True is invalid: cannot be combined with diff_attn=True"),
])
def test_bad_settings_are_one_line_errors(fields, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|")) as info:
        ModelConfig(**fields)
    assert "\n" not in str(info.value)
