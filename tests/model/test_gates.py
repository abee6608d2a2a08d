"""The pieces of ``nanoattn/model/gates.py`` (canon layers, token shift), beside the mechanisms of
``nanoattn/mechanisms`` (output gates, Scalable-Softmax, exclusive self-attention: tests/mechanisms).

Each against its paper's equation written out in float64 and a reference implementation
(transformers' Qwen3-Next attention and x-transformers' gated values for the gate, the canon
reference code's depthwise ``nn.Conv1d``, alone and hooked into the plain model) is in
nanoattn/references. Here: their shapes and starting values, token shift as canon's width-2
case, SDPA's kernel kept, bad settings. Cached decoding, head analysis and learning run over the
registry's rows in the generic tests (tests/variants.py).
"""


import pytest
import torch

from nanoattn import GPT, ModelConfig, generate
from nanoattn.model import attention as attention_module
from nanoattn.model.gates import Canon
from nanoattn.model.gpt import shift_tokens

T = 12  # tokens


# --- canon layers -----------------------------------------------------------------------------------------


def test_token_shift_is_canon_of_width_2_with_one_gate():
    """e_t + g * e_{t-1}: a current tap of 0 and a previous tap g (taps in nn.Conv1d's order)."""
    canon = Canon(ModelConfig(d_model=16, canon=2), layer=0)
    gate = torch.randn(16)
    with torch.no_grad():
        canon.weight.copy_(torch.stack([gate, torch.zeros(16)], dim=1))
        e = torch.randn(2, T, 16)
        torch.testing.assert_close(canon(e), shift_tokens(e, gate))


def test_canon_adds_only_its_taps_to_the_plain_model():
    fields = dict(vocab_size=40, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=16)
    canon = GPT(ModelConfig(**fields, canon=3))
    missing, unexpected = GPT(ModelConfig(**fields)).load_state_dict(canon.state_dict(), strict=False)
    assert not missing and sorted(unexpected) == ["blocks.0.canon.weight", "blocks.1.canon.weight"]


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
    (dict(canon=1), "model.canon=1 is invalid: must be 0 .off. or a convolution width from 2"),
    (dict(canon=-2), "model.canon=-2 is invalid"),
    (dict(canon=True), "model.canon=True is invalid"),
    (dict(canon=2.5), "model.canon=2.5 is invalid"),
    (dict(xsa=True, diff_attn=True), "model.xsa=True is invalid: cannot be combined with diff_attn=True"),
])
def test_bad_settings_are_one_line_errors(fields, message):
    with pytest.raises(ValueError, match=message.replace("|", r"\|")) as info:
        ModelConfig(**fields)
    assert "\n" not in str(info.value)
