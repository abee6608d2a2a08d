"""Stick-breaking and sigmoid attention (``attn_fn``) and FoX's forget gate (``forget_gate``).

Each against its paper's equations written out in float64 loops (Tan et al. 2025, Ramapuram et al.
2024, Lin et al. 2025; NoPE and ALiBi, MHA, GQA and MQA, both paths and the weights) and, for sigmoid
attention and FoX, against x-transformers' ``Attend(sigmoid=True)`` and ``DataDependentAlibi``, is in
nanoattn/references. Here: what each weighs and starts from, memory linear in the length, bf16,
the cache's log gates, bad settings. Cached decoding over the registry's rows is in test_generate.py,
head analysis in test_heads.py.
"""

import math

import pytest
import torch

from nanoattn import GPT, KVCache, ModelConfig
from nanoattn.mechanisms.score_functions import SCORE_FUNCTIONS
from nanoattn.positional import build_positional
from nanoattn.references.attention import TOKENS, layer


def test_every_registered_score_function_is_an_attn_fn_choice_and_only_those():
    for name in SCORE_FUNCTIONS:
        assert ModelConfig(attn_fn=name).attn_fn == name
    allowed = " \\| ".join(SCORE_FUNCTIONS)
    with pytest.raises(ValueError, match=rf"^model\.attn_fn='softmin' is invalid: allowed: {allowed}$"):
        ModelConfig(attn_fn="softmin")


def test_stick_breaking_weighs_earlier_keys_only_and_leaves_part_of_the_stick():
    """The query's own key and, so, the first query's row weigh nothing; the stick left over,
    1 - sum_j A_ij, is large in some rows (the paper's weights, not a softmax's)."""
    attn, cfg = layer(2, attn_fn="stick_breaking")
    with torch.no_grad():
        weights = attn(torch.randn(2, TOKENS, 32), build_positional(cfg), torch.arange(TOKENS), TOKENS,
                       return_weights=True)[1]  # [B, H, T, T]
    assert (weights[:, :, 0] == 0).all() and (weights.diagonal(dim1=-2, dim2=-1) == 0).all()
    left = 1 - weights.sum(-1)[:, :, 1:]
    assert 0.05 < left.mean() < 0.95 and left.max() > 0.5


def test_sigmoid_attentions_bias_is_minus_log_of_the_training_length():
    attn, _ = layer(attn_fn="sigmoid")
    assert attn.score_fn.bias == -math.log(TOKENS)


def test_the_forget_gate_is_a_linear_layer_with_a_bias_from_zero_as_foxs():
    """FoX's data-dependent gate (``fgate_type='full'``): nn.Linear(d_model, n_head) with a bias, drawn
    as every linear layer (zero bias: gates start near 1/2), whatever the model's ``bias``."""
    model = GPT(ModelConfig(d_model=32, n_layer=2, n_head=4, n_kv_head=2, pos="nope", forget_gate=True))
    gate = model.blocks[0].attn.forget_gate.proj
    assert gate.weight.shape == (4, 32) and (gate.bias == 0).all() and not model.cfg.bias
    assert gate.weight.std().item() == pytest.approx(model.cfg.init_std, rel=0.3)


@pytest.mark.parametrize("fields", [dict(attn_fn="stick_breaking"), dict(attn_fn="sigmoid"),
                                    dict(forget_gate=True)], ids=["stick_breaking", "sigmoid", "fox"])
def test_evaluation_at_a_long_length_builds_one_chunk_of_scores_at_a_time(chunks_built, small_chunks,
                                                                         fields):
    """Memory linear in T: no score, weight or bias chunk is larger than MASK_CHUNK_ELEMENTS."""
    cfg = ModelConfig(vocab_size=50, d_model=32, n_layer=1, n_head=4, pos="nope", **fields)
    with torch.no_grad():
        GPT(cfg).eval()(torch.randint(0, 50, (1, 1024)))
    sizes = [size for _, _, size in chunks_built]
    assert max(sizes) <= 1 << 16  # the whole [4 heads, 1024, 1024] would be 64x that
    assert len(sizes) == 1024 // ((1 << 16) // (4 * 1024))  # a chunk of 16 queries at a time


@pytest.mark.parametrize("fields", [dict(attn_fn="stick_breaking"), dict(attn_fn="sigmoid"),
                                    dict(forget_gate=True)], ids=["stick_breaking", "sigmoid", "fox"])
def test_bf16_autocast_stays_as_close_to_float32_as_the_plain_block(fields):
    """Under bf16 autocast (the scores in bf16 on CPU where the matmuls are timed faster), the
    logits stay within bf16 rounding: their error against float32 at most twice the plain block's.
    Stick-breaking sums its logs in float32 and FoX keeps its gates' sums in float32."""
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
