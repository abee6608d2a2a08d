"""Per-token positions [B, T]: every encoding that takes them computes with them, exactly under the KV
cache; every other one refuses them in one line.

References: the same model at the default positions (given 0..T-1 must change nothing), one full
forward pass at the given positions (cached decoding must equal it at every step), each row alone
(the batch axis), and RoPE's and ALiBi's relative form (a constant shift of every position changes
nothing).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from variants import VARIANTS

from nanoattn import GPT, KVCache, ModelConfig, generate
from nanoattn.generate import Decoding
from nanoattn.positional import REGISTRY, encodings_with
from nanoattn.train.step import LossModule, optimizer_step

MAX_SEQ_LEN = 16
PROMPT, NEW = 5, 11
TAKING = encodings_with("takes_positions")
REFUSING = [name for name in REGISTRY if name not in TAKING]
LAYOUTS = {"mha": 4, "gqa": 2, "mqa": 1}


def tiny(pos="rope", n_kv_head=2, **fields) -> GPT:
    torch.manual_seed(0)
    cfg = ModelConfig(**{**dict(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=n_kv_head, d_ff=64,
                                max_seq_len=MAX_SEQ_LEN, init_std=0.1, pos=pos), **fields})
    model = GPT(cfg).eval()
    with torch.no_grad():  # what starts neutral (learned table, sinusoid amplitude) must act
        for p in model.pos.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
    return model


def tokens(length=PROMPT + NEW, batch=2) -> torch.Tensor:
    return torch.randint(0, 64, (batch, length), generator=torch.Generator().manual_seed(1))


def coupled(length=PROMPT + NEW, batch=2, high=2 * MAX_SEQ_LEN) -> torch.Tensor:
    """Positions as position coupling makes them: repeated, going back, different in each row, and
    past the training length (below ``high``)."""
    return torch.randint(0, high, (batch, length), generator=torch.Generator().manual_seed(3))


def high_for(pos: str) -> int:
    return MAX_SEQ_LEN if REGISTRY[pos].learned_length else 2 * MAX_SEQ_LEN


@pytest.mark.parametrize("pos", TAKING)
def test_given_default_positions_change_nothing_and_others_do(pos):
    model, idx = tiny(pos), tokens()
    with torch.no_grad():
        default = model(idx)
        given = model(idx, torch.arange(idx.shape[1]).expand_as(idx).contiguous())
        moved = model(idx, coupled(high=high_for(pos)))
    torch.testing.assert_close(given, default, atol=1e-6, rtol=1e-6)
    assert (moved - default).abs().max() > 1e-3  # the encoding reads what it is given


@pytest.mark.parametrize("pos", TAKING)
def test_each_row_takes_its_own_positions(pos):
    model, idx, positions = tiny(pos), tokens(), coupled(high=high_for(pos))
    with torch.no_grad():
        batched = model(idx, positions)
        alone = torch.cat([model(idx[b:b + 1], positions[b:b + 1]) for b in range(2)])
    torch.testing.assert_close(batched, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pos", ["rope", "alibi", "xpos"])
def test_relative_encodings_see_only_differences(pos):
    """RoPE's q_m.k_n depends on m - n, ALiBi's bias is -slope (m - n), xPos's scale zeta^((n - m)/gamma):
    shifting every given position by one constant leaves the logits as they are."""
    model, idx, positions = tiny(pos), tokens(), coupled(high=MAX_SEQ_LEN)
    with torch.no_grad():
        torch.testing.assert_close(model(idx, positions + 7), model(idx, positions), atol=1e-4, rtol=1e-4)


def decode_and_compare(model: GPT, high: int, **options) -> None:
    """Greedy decoding at given positions, with and without the cache, equals one forward pass of the
    final sequence at those positions at every step."""
    positions = coupled(high=high)
    greedy = dict(temperature=0, repetition_penalty=3.0, positions=positions)
    decoding = Decoding(model, tokens(PROMPT), NEW, **greedy, **options)
    steps = [decoding.last_logits for _ in decoding]
    with torch.no_grad():
        full = model(decoding.idx, positions)  # [B, T, V]
    for step, logits in enumerate(steps):
        torch.testing.assert_close(logits, full[:, PROMPT + step - 1], atol=1e-5, rtol=1e-5)
    assert torch.equal(decoding.idx, generate(model, tokens(PROMPT), NEW, use_cache=False, **greedy))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("pos", TAKING)
def test_cached_decoding_at_given_positions_equals_recomputation(pos, layout):
    decode_and_compare(tiny(pos, LAYOUTS[layout]), high_for(pos))


@pytest.mark.parametrize("variant", ["window", "local_global", "mla", "diff", "sinks", "gate", "xsa", "canon",
                                     "stick_breaking", "sigmoid", "selective"])
def test_cached_decoding_at_given_positions_with_attention_variants(variant):
    """A rolling window buffer reads its keys' positions back from the cache; latent attention
    rotates its cached shared key at its own."""
    decode_and_compare(tiny(**{**VARIANTS[variant], "pos": "rope"}), 2 * MAX_SEQ_LEN)


def test_sliding_window_decoding_takes_the_window_positions():
    model = tiny("alibi")
    decode_and_compare(model, 2 * MAX_SEQ_LEN, sliding_window=True, use_cache=False)


def test_attention_maps_at_given_positions_equal_the_fast_path():
    model, idx, positions = tiny("t5"), tokens(), coupled()
    with torch.no_grad():
        logits, weights = model.attention_maps(idx, positions)
        torch.testing.assert_close(logits, model(idx, positions), atol=1e-5, rtol=1e-5)
    assert len(weights) == 2 and torch.allclose(weights[0].sum(-1), torch.ones(2, 4, idx.shape[1]))
    assert float(weights[0].triu(1).abs().max()) == 0.0  # causal by token order, whatever the positions


@pytest.mark.parametrize("pos", REFUSING)
def test_encodings_without_positions_refuse_them_in_one_line(pos):
    model, idx = tiny(pos), tokens()
    with pytest.raises(ValueError, match=f"^positions=\\[2, 16\\] is invalid for this model: pos='{pos}' has "
                                         f"no use for them [^\n]* take them: [^\n]*rope \\| [^\n]*$"):
        model(idx, coupled())
    with pytest.raises(ValueError, match="^positions=\\[2, 16\\] is invalid for this model: pos=[^\n]*$"):
        generate(model, tokens(PROMPT), NEW, positions=coupled())


def test_layouts_and_length_dependent_rotations_refuse_them_in_one_line():
    with pytest.raises(ValueError, match="pos=\\['rope', 'nope'\\] has no use for them \\(nope reads no"):
        tiny(["rope", "nope"])(tokens(), coupled())
    dynamic = tiny("rope", rope_scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(ValueError, match="^positions=.* rope_scaling type 'dynamic' rotates by the sequence "
                                         "length, which given positions do not fix$"):
        dynamic(tokens(), coupled())
    assert tiny(["rope", "alibi"]).positions_refusal is None
    for field in ("ssmax", "forget_gate"):  # they count a query's keys by its default position
        with pytest.raises(ValueError, match=f"^positions=.* is invalid for this model: model.{field}=True "
                                             "counts each query's keys by its default position, 0..T-1$"):
            tiny("rope", **{field: True})(tokens(), coupled())
    for field in ("ssmax", "forget_gate"):  # they count a query's keys by its default position
        with pytest.raises(ValueError, match=f"^positions=.* is invalid for this model: model.{field}=True "
                                             "counts each query's keys by its default position, 0..T-1$"):
            tiny("rope", **{field: True})(tokens(), coupled())


def test_bad_positions_are_refused_in_one_line():
    model, idx = tiny(), tokens()
    for bad, why in ((coupled().int(), "must be an int64 tensor shaped like idx"),
                     (coupled()[:, :4], "must be an int64 tensor shaped like idx"),
                     (coupled() - 40, "must be >= 0, the smallest is -40")):
        with pytest.raises(ValueError, match=f"^positions[^\n]* is invalid: {why}[^\n]*$"):
            model(idx, bad)
    with pytest.raises(ValueError, match="sequence length 52 is past the learned position table"):
        tiny("learned")(idx, coupled() + 20)
    with pytest.raises(ValueError, match="^generate.positions=.* must be a tensor \\[B, T \\+ "
                                         "max_new_tokens\\] = \\[2, 16\\]"):
        generate(model, tokens(PROMPT), NEW, positions=coupled()[:, :PROMPT])
    with pytest.raises(ValueError, match="^positions=\\[2, 5\\] is invalid with a streaming cache: its"):
        generate(model, tokens(PROMPT), NEW, positions=coupled(), streaming=(1, 4))


def test_a_cache_holds_one_kind_of_positions():
    model, idx, positions = tiny(), tokens(), coupled()
    with torch.no_grad():
        cache = KVCache(model.cfg, 2, 16)
        model(idx[:, :8], positions[:, :8], cache=cache)
        assert torch.equal(cache.positions[:, :8], positions[:, :8])
        with pytest.raises(ValueError, match="^positions=None is invalid here: the KV cache holds 8 tokens "
                                             "at given positions, so the new tokens need theirs$"):
            model(idx[:, 8:], cache=cache)
        cache = KVCache(model.cfg, 2, 16)
        model(idx[:, :8], cache=cache)
        assert cache.positions is None  # the default path keeps nothing
        with pytest.raises(ValueError, match="^positions=\\[2, 8\\] is invalid here: the KV cache holds 8"):
            model(idx[:, 8:], positions[:, 8:], cache=cache)


def test_a_training_step_takes_a_batch_with_positions():
    model = tiny("alibi").train()
    idx, positions = tokens(), coupled()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batch = (idx[:, :-1], idx[:, 1:], positions[:, :-1])
    loss, _ = optimizer_step(LossModule(model), model, optimizer, [batch], grad_clip=1.0,
                             autocast=contextlib.nullcontext)
    with torch.no_grad():
        assert float(model.loss(idx[:, :-1], idx[:, 1:], positions[:, :-1])) < float(loss)
