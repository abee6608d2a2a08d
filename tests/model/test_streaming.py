"""StreamingLLM (Xiao et al. 2023): sinks plus a window in a fixed-size cache, positions in the cache.

References: for one layer, where cached keys and values depend on their token alone, every
streamed step equals recomputing the model on [the first n_sink tokens + the newest window ones]
at positions 0..n_sink + window - 1 (the paper's position assignment); for any depth, a stream
that still fits the cache equals plain cached decoding.
"""

import re

import pytest
import torch

from nanoattn import GPT, ModelConfig, generate
from nanoattn.eval.length import evaluate_lengths, score_length, score_streaming
from nanoattn.generate import Decoding
from nanoattn.model import StreamingCache
from nanoattn.positional import REGISTRY

SINKS, WINDOW, PROMPT = 2, 6, 5


def model(pos: str = "rope", n_layer: int = 1, **fields) -> GPT:
    torch.manual_seed(0)
    base = dict(vocab_size=64, d_model=32, n_layer=n_layer, n_head=4, n_kv_head=2, max_seq_len=16, pos=pos,
                init_std=0.1)
    cfg = ModelConfig(**{**base, **fields})
    net = GPT(cfg).eval()
    with torch.no_grad():  # parameters that start neutral must act
        for name, p in net.named_parameters():
            if name.startswith("pos.") or "qk_norm" in name or name == "shift_gate":
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(2)) * 0.1)
    return net


def prompt() -> torch.Tensor:
    return torch.randint(0, 64, (2, PROMPT), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("fields", [dict(pos="rope"), dict(pos="alibi"), dict(pos="xpos"), dict(pos="cope"),
                                    dict(pos="nope"), dict(pos="rope", qk_norm="after_rope"),
                                    dict(pos="rope", rope_scaling={"type": "dynamic", "factor": 2.0}),
                                    dict(pos="rope", mla_kv_rank=12, mla_rope_dim=4, n_kv_head=4),
                                    dict(pos="nope", forget_gate=True),
                                    dict(pos="nope", attn_fn="stick_breaking")],
                         ids=["rope", "alibi", "xpos", "cope", "nope", "rope-qk_norm_after", "rope-dynamic",
                              "mla", "fox", "stick_breaking"])
def test_one_layer_streaming_equals_recomputing_sinks_and_window_at_cache_positions(fields):
    net = model(**fields)
    decoding = Decoding(net, prompt(), 40, temperature=0, streaming=(SINKS, WINDOW))
    for step, _ in enumerate(decoding):
        seen = decoding.idx[:, :PROMPT + step]
        held = seen if seen.shape[1] <= SINKS + WINDOW else torch.cat([seen[:, :SINKS], seen[:, -WINDOW:]], 1)
        with torch.no_grad():
            expected = net(held)[:, -1]
        torch.testing.assert_close(decoding.last_logits, expected, atol=1e-5, rtol=1e-5)
    assert decoding.idx.shape[1] == PROMPT + 40  # 45 tokens through an 8-token cache


@pytest.mark.parametrize("token_shift", [False, True])
def test_a_stream_that_fits_the_cache_is_plain_cached_decoding(token_shift):
    """With token shift, each piece's first token takes its predecessor from the streaming cache."""
    net = model(n_layer=3, token_shift=token_shift)
    # The cache is exactly full at the last step.
    streamed = Decoding(net, prompt(), 15, temperature=0, streaming=(SINKS, PROMPT + 15 - SINKS))
    plain = Decoding(net, prompt(), 15, temperature=0)
    for _ in zip(streamed, plain, strict=True):
        torch.testing.assert_close(streamed.last_logits, plain.last_logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(streamed.idx, plain.idx)


def test_the_cache_keeps_the_sinks_evicts_the_middle_and_never_grows():
    net = model(n_layer=2)
    cache = StreamingCache(net.cfg, 1, SINKS, WINDOW)
    stream = torch.randint(0, 64, (1, 50), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        net(stream[:, :SINKS + WINDOW], cache=cache)
        sink_keys = cache.k[0][:, :, :SINKS].clone()
        nbytes = cache.nbytes
        for t in range(SINKS + WINDOW, 50):
            net(stream[:, t:t + 1], cache=cache)
    assert cache.length == SINKS + WINDOW and cache.nbytes == nbytes
    assert torch.equal(cache.k[0][:, :, :SINKS], sink_keys)  # the first tokens stay
    # Layer 0's keys depend on their token alone: the window holds the newest tokens' keys.
    with torch.no_grad():
        fresh = StreamingCache(net.cfg, 1, 0, WINDOW)
        net(stream[:, -WINDOW:], cache=fresh)
    torch.testing.assert_close(cache.k[0][:, :, SINKS:], fresh.k[0])


def test_sinks_change_what_a_window_sees_after_the_first_eviction():
    net = model(n_layer=2)
    tokens = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(4))
    with_sinks, n = score_streaming(net, tokens, SINKS, WINDOW)
    without, _ = score_streaming(net, tokens, 0, WINDOW)
    assert n == 39 and with_sinks != pytest.approx(without, abs=1e-6)
    # A cache as long as the stream evicts nothing: the plain model's loss over the whole window.
    whole, _ = score_streaming(net, tokens, SINKS, 40)
    assert whole == pytest.approx(score_length(net, tokens, 39)[0], abs=1e-5)


@pytest.mark.parametrize(("options", "message"), [
    (dict(streaming=(2,)), r"generate.streaming=\(2,\) is invalid: must be \(n_sink, window\)"),
    (dict(streaming=(-1, 4)), "must be \\(n_sink, window\\): integers >= 0 and >= 1"),
    (dict(streaming=(2, 0)), "must be \\(n_sink, window\\)"),
    (dict(streaming=(2, 4), use_cache=False), "needs use_cache=True and sliding_window=False"),
    (dict(streaming=(2, 4), sliding_window=True), "needs use_cache=True and sliding_window=False"),
])
def test_bad_streaming_options_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as info:
        generate(model(), prompt(), 4, **options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("pos", sorted(REGISTRY))
def test_sampling_and_the_length_evaluation_share_one_streaming_rule_by_capability(pos):
    """An encoding that adds positions to the embeddings (``acts_on_embeddings``) is refused for
    StreamingLLM alike by sample.py's generate(streaming=...) and eval_length's mode=streaming, for
    the same reason; every other encoding streams in both."""
    net = model(pos)
    stream = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(1))
    if REGISTRY[pos].acts_on_embeddings:
        reason = f"needs positions inside attention, which the cache can move; pos='{pos}' adds them to the "
        with pytest.raises(ValueError, match=re.escape(f"generate.streaming=(2, 4) is invalid: {reason}")):
            generate(net, prompt(), 4, streaming=(2, 4))
        with pytest.raises(ValueError, match=re.escape(f"length_eval.mode='streaming' is invalid: {reason}")):
            evaluate_lengths(net, stream, [8], mode="streaming", n_sink=2)
    else:
        assert generate(net, prompt(), 4, streaming=(2, 4)).shape == (2, PROMPT + 4)
        assert evaluate_lengths(net, stream, [8], mode="streaming", n_sink=2).results[0].ppl is not None


def test_streaming_refuses_oversized_pieces():
    net = model()
    cache = StreamingCache(net.cfg, 2, SINKS, WINDOW)
    with torch.no_grad():
        net(prompt(), cache=cache)
        with pytest.raises(ValueError, match="7 new tokens do not fit a streaming cache of 2 sink \\+ 6"):
            net(torch.zeros(2, 7, dtype=torch.long), cache=cache)
