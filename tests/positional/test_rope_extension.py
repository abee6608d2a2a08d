"""Zero-shot RoPE context extension at the model level, through ``load_checkpoint(rope_scaling=...)``.

A tiny random (untrained) RoPE model is saved with ``save_checkpoint`` as if trained at ``TRAIN_LEN``
tokens; every test loads it back with a scaling override. What is asserted:

- the override lands in the loaded config (``original_max_seq_len`` = the checkpoint's training
  length unless given) and the model's rotation tables equal ``rope_frequencies``' formula;
- non-RoPE checkpoints refuse it with one line naming ``pos``;
- ``dynamic`` leaves logits bit-identical up to the original length and changes every position
  but the first beyond it; the static types (linear, ntk, yarn, llama3) change logits at every
  length, since they are fixed re-parametrisations, not length-triggered;
- YaRN (with a 2048-token original length, so that the kept band is real at head_dim 32), on
  scores q_m . k_n of the model's own positional module: pairs below the ramp keep their
  frequency (scores equal plain RoPE's times attention_factor**2 at every distance), pairs above
  it are position-interpolated (equal PI's), so the whole-head score at distances 1-4 is nearly
  unchanged while PI's is not;
- KV-cached decoding with a bare ``KVCache`` (token by token and in chunks, crossing the original
  length) equals recomputation for the static types. For dynamic it does so up to the original
  length only, and ``pos.rotation_changes`` (what ``generate`` re-encodes on) is True exactly
  from there on: the documented caveat. ``generate`` itself is tested in tests/test_generate.py.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from nanoattn import GPT, KVCache, ModelConfig, load_checkpoint
from nanoattn.checkpoint import save_checkpoint
from nanoattn.positional.rope_scaling import (
    normalize_rope_scaling,
    rope_frequencies,
    yarn_attention_factor,
    yarn_correction_range,
)

TRAIN_LEN = 32
TYPES = ("linear", "ntk", "dynamic", "yarn", "llama3")
STATIC_TYPES = ("linear", "ntk", "yarn", "llama3")
FACTOR = 4.0
# init_std 0.2 (not 0.02) so attention scores are O(1) and a changed rotation visibly moves logits.
TINY = dict(vocab_size=97, d_model=64, n_layer=2, n_head=2, n_kv_head=1, d_ff=128, init_std=0.2)


def save_tiny(root, *, pos: str = "rope", max_seq_len: int = 2 * TRAIN_LEN) -> GPT:
    """Save a seeded tiny model whose checkpoint says it was trained at TRAIN_LEN (< max_seq_len)."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(**TINY, max_seq_len=max_seq_len, pos=pos))
    save_checkpoint(root / "checkpoints", "1", model, train_seq_len=TRAIN_LEN, step=1)
    return model


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("rope_run")
    save_tiny(root)
    return root


@pytest.fixture(scope="module")
def tokens():
    generator = torch.Generator().manual_seed(1)
    return torch.randint(0, TINY["vocab_size"], (2, 3 * TRAIN_LEN), generator=generator)


def logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(idx)


def scaling(kind: str, **extra) -> dict:
    return {"type": kind, "factor": FACTOR, **extra}


# ----------------------------------------------------------------------------- the override


@pytest.mark.parametrize("kind", TYPES)
def test_override_defaults_original_length_to_the_training_length(run_dir, kind):
    ckpt = load_checkpoint(run_dir, rope_scaling=scaling(kind))
    # The checkpoint's max_seq_len is 2 * TRAIN_LEN: the default must come from train_seq_len.
    assert ckpt.train_seq_len == TRAIN_LEN and ckpt.config.max_seq_len == 2 * TRAIN_LEN
    expected = normalize_rope_scaling(scaling(kind, original_max_seq_len=TRAIN_LEN), 2 * TRAIN_LEN)
    assert ckpt.config.rope_scaling == expected
    assert ckpt.model.pos.scaling == expected
    plain = load_checkpoint(run_dir)
    for name, tensor in plain.model.state_dict().items():  # weights untouched: only positions change
        assert torch.equal(ckpt.model.state_dict()[name], tensor), name


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("seq_len", [TRAIN_LEN, 3 * TRAIN_LEN])
def test_loaded_rotation_tables_follow_the_formula(run_dir, kind, seq_len):
    ckpt = load_checkpoint(run_dir, rope_scaling=scaling(kind))
    inv_freq, attention_factor = rope_frequencies(ckpt.config.head_dim, ckpt.config.rope_theta,
                                                  ckpt.config.rope_scaling, seq_len=seq_len)
    phase = torch.arange(seq_len, dtype=torch.int64).float()[:, None] * inv_freq[None, :]  # [L, D / 2]
    cos, sin = ckpt.model.pos.cos_sin(seq_len, torch.device("cpu"))
    torch.testing.assert_close(cos[:seq_len], torch.cos(phase) * attention_factor, rtol=0, atol=0)
    torch.testing.assert_close(sin[:seq_len], torch.sin(phase) * attention_factor, rtol=0, atol=0)


def test_explicit_original_length_wins(run_dir):
    ckpt = load_checkpoint(run_dir, rope_scaling=scaling("yarn", original_max_seq_len=16))
    assert ckpt.config.rope_scaling["original_max_seq_len"] == 16


def test_no_override_loads_the_saved_model(run_dir, tokens):
    ckpt = load_checkpoint(run_dir)
    assert ckpt.config.rope_scaling is None
    torch.manual_seed(0)
    original = GPT(ModelConfig(**TINY, max_seq_len=2 * TRAIN_LEN)).eval()  # the same seed as save_tiny
    assert torch.equal(logits(ckpt.model, tokens), logits(original, tokens))


@pytest.mark.parametrize("pos", ["learned", "sinusoidal", "alibi", "nope"])
def test_non_rope_checkpoint_refuses_the_override(tmp_path, pos):
    save_tiny(tmp_path, pos=pos, max_seq_len=4 * TRAIN_LEN)
    with pytest.raises(ValueError) as info:
        load_checkpoint(tmp_path, rope_scaling=scaling("linear"))
    message = str(info.value)
    assert "\n" not in message
    assert "rope_scaling" in message and f"pos={pos!r}" in message and "RoPE" in message
    load_checkpoint(tmp_path)  # the checkpoint itself is fine


# ----------------------------------------------------------------------------- where logits change


@pytest.mark.parametrize("factor", [1.0, 2.0, FACTOR, 16.0])
def test_dynamic_is_identical_up_to_the_original_length(run_dir, tokens, factor):
    plain = load_checkpoint(run_dir).model
    dynamic = load_checkpoint(run_dir, rope_scaling={"type": "dynamic", "factor": factor}).model
    for length in (1, 2, TRAIN_LEN // 2, TRAIN_LEN):
        assert torch.equal(logits(dynamic, tokens[:, :length]), logits(plain, tokens[:, :length])), length


@pytest.mark.parametrize("length", [TRAIN_LEN + 1, 2 * TRAIN_LEN, 3 * TRAIN_LEN])
def test_dynamic_changes_every_position_beyond_the_original_length(run_dir, tokens, length):
    plain = logits(load_checkpoint(run_dir).model, tokens[:, :length])
    dynamic = logits(load_checkpoint(run_dir, rope_scaling=scaling("dynamic")).model, tokens[:, :length])
    change = (dynamic - plain).abs().amax(dim=-1)  # [B, T]
    # Position 0 attends to itself only (rotation by 0 on both sides), so only it can stay equal;
    # the base is a function of the whole length, so every later position sees new frequencies.
    torch.testing.assert_close(dynamic[:, 0], plain[:, 0])
    assert (change[:, 1:] > 1e-4).all()


@pytest.mark.parametrize("kind", STATIC_TYPES)
def test_static_types_change_logits_within_the_original_length(run_dir, tokens, kind):
    plain = logits(load_checkpoint(run_dir).model, tokens[:, :TRAIN_LEN])
    scaled = logits(load_checkpoint(run_dir, rope_scaling=scaling(kind)).model, tokens[:, :TRAIN_LEN])
    assert (scaled - plain)[:, 1:].abs().amax() > 1e-3


# ----------------------------------------------------------------------------- YaRN keeps the fast pairs

# A long original length gives YaRN a real band of kept pairs at head_dim 32: with theta = 1e4,
# beta_fast = 32 and beta_slow = 1, pairs 0-4 rotate more than 32 times over 2048 tokens (kept),
# pairs 11-15 fewer than once (interpolated by the factor), pairs 5-10 are the ramp.
YARN_ORIGINAL = 2048
SCORE_LEN = 64


def rotary_scores(pos, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q, k [N, 1, T, D] -> q_m . k_n [N, 1, T, T] after the positional module's rotation."""
    positions = torch.arange(q.shape[2])
    return pos.rotate(q, positions, q.shape[2]) @ pos.rotate(k, positions, q.shape[2]).transpose(-1, -2)


def pair_mask(pairs: torch.Tensor) -> torch.Tensor:
    """bool [D / 2] -> 1.0 on both dims (i, i + D/2) of each selected pair (half-split), else 0: [D]."""
    return torch.cat([pairs, pairs]).float()


@pytest.fixture(scope="module")
def yarn_setup(run_dir):
    plain = load_checkpoint(run_dir).model
    yarn, linear = (load_checkpoint(run_dir, rope_scaling=scaling(kind, original_max_seq_len=YARN_ORIGINAL))
                    .model for kind in ("yarn", "linear"))
    head_dim = plain.cfg.head_dim
    generator = torch.Generator().manual_seed(2)
    q, k = (torch.randn(256, 1, SCORE_LEN, head_dim, generator=generator) for _ in range(2))
    low, high = yarn_correction_range(head_dim, plain.cfg.rope_theta, 32.0, 1.0, YARN_ORIGINAL)
    return plain.pos, yarn.pos, linear.pos, q, k, low, high, yarn_attention_factor(FACTOR) ** 2


def test_yarn_fast_pairs_keep_plain_rope_scores_at_every_distance(yarn_setup):
    plain, yarn, _, q, k, low, high, temperature = yarn_setup
    assert (low, high) == (4, 11)  # the band described above; the test means nothing without it
    fast = pair_mask(torch.arange(q.shape[-1] // 2) <= low)
    torch.testing.assert_close(rotary_scores(yarn, q * fast, k * fast),
                               temperature * rotary_scores(plain, q * fast, k * fast), rtol=1e-5, atol=1e-5)


def test_yarn_slow_pairs_are_position_interpolated(yarn_setup):
    plain, yarn, linear, q, k, low, high, temperature = yarn_setup
    slow = pair_mask(torch.arange(q.shape[-1] // 2) >= high)
    yarn_scores = rotary_scores(yarn, q * slow, k * slow)
    torch.testing.assert_close(yarn_scores, temperature * rotary_scores(linear, q * slow, k * slow),
                               rtol=1e-5, atol=1e-5)
    # PI: the vectors at positions m, n score as plain RoPE's at m / s, n / s (where those are integers).
    stride = int(FACTOR)
    plain_at_fraction = rotary_scores(plain, (q * slow)[:, :, ::stride], (k * slow)[:, :, ::stride])
    torch.testing.assert_close(yarn_scores[..., ::stride, ::stride], temperature * plain_at_fraction,
                               rtol=1e-4, atol=1e-4)


def test_yarn_scores_at_small_distances_are_nearly_unchanged(yarn_setup):
    plain, yarn, linear, q, k, *_, temperature = yarn_setup
    reference = rotary_scores(plain, q, k)
    yarn_scores = rotary_scores(yarn, q, k) / temperature  # the attention factor is a deliberate change
    linear_scores = rotary_scores(linear, q, k)

    def relative_rms_change(scores: torch.Tensor, distance: int) -> float:
        m = torch.arange(distance, SCORE_LEN)
        change, base = (scores - reference)[..., m, m - distance], reference[..., m, m - distance]
        return math.sqrt(change.pow(2).mean() / base.pow(2).mean())

    for distance in (1, 2, 3, 4):
        # Measured: YaRN 0.3-1.2 %, PI 22-68 % at these distances.
        assert relative_rms_change(yarn_scores, distance) < 0.02
        assert relative_rms_change(linear_scores, distance) > 0.2


# ----------------------------------------------------------------------------- KV cache

# Prefill, then steps of these sizes; both cross the original length (Tq = 1 and mask-path chunks).
CHUNKS = [(TRAIN_LEN - 4,) + (1,) * 12 + (3, 5, 7), (TRAIN_LEN + 8,) + (1,) * 8]


def cached_vs_recomputed(model: GPT, idx: torch.Tensor, chunks: tuple[int, ...]) -> list[float]:
    """Feed idx [1, T] to a KV cache in chunks; per chunk, the largest logit gap to a full forward
    over the tokens so far (for dynamic: with the base of that length)."""
    cache = KVCache(model.cfg, batch_size=1, capacity=sum(chunks))
    gaps, start = [], 0
    for size in chunks:
        with torch.no_grad():
            step = model(idx[:, start:start + size], cache=cache)  # [1, size, V]
        start += size
        gaps.append((step - logits(model, idx[:, :start])[:, -size:]).abs().max().item())
    assert cache.length == start > TRAIN_LEN
    return gaps


@pytest.mark.parametrize("kind", (None, *STATIC_TYPES))
@pytest.mark.parametrize("chunks", CHUNKS)
def test_cached_decoding_equals_recomputation(run_dir, tokens, kind, chunks):
    model = load_checkpoint(run_dir, rope_scaling=None if kind is None else scaling(kind)).model
    assert max(cached_vs_recomputed(model, tokens[:1], chunks)) < 1e-4


@pytest.mark.parametrize("chunks", CHUNKS)
def test_dynamic_bare_cache_is_exact_only_while_the_base_is_unchanged(run_dir, tokens, chunks):
    # The documented caveat (docs/rope_scaling.md): cached keys were rotated, and deeper layers'
    # keys and values computed, with the base of the step that produced them; recomputation redoes
    # everything with the current base. Equal while the base is unchanged (length <= L0) and for
    # the prefill, which is one pass whatever its length; generate re-encodes past that point.
    model = load_checkpoint(run_dir, rope_scaling=scaling("dynamic")).model
    gaps, ends = cached_vs_recomputed(model, tokens[:1], chunks), list(itertools.accumulate(chunks))
    exact = [gaps[0]] + [gap for gap, end in zip(gaps[1:], ends[1:], strict=True) if end <= TRAIN_LEN]
    stale = [gap for gap, end in zip(gaps[1:], ends[1:], strict=True) if end > TRAIN_LEN]
    assert max(exact) < 1e-4
    assert min(stale) > 1e-3


@pytest.mark.parametrize("kind", TYPES)
def test_rotation_changes_exactly_when_the_cache_goes_stale(run_dir, kind):
    """The signal generate re-encodes on: only dynamic, and only once the length passes L0."""
    pos = load_checkpoint(run_dir, rope_scaling=scaling(kind)).model.pos
    for old, new in [(1, TRAIN_LEN), (TRAIN_LEN // 2, TRAIN_LEN), (TRAIN_LEN, TRAIN_LEN + 1),
                     (TRAIN_LEN + 1, TRAIN_LEN + 2), (TRAIN_LEN, 3 * TRAIN_LEN)]:
        assert pos.rotation_changes(old, new) == (kind == "dynamic" and new > TRAIN_LEN), (old, new)
