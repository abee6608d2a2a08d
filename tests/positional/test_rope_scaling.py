"""RoPE scaling: parity with transformers' ``modeling_rope_utils``, the papers' formulas, validation.

transformers 5.x computes RoPE parameters from a config object: we build a minimal
``LlamaConfig`` whose ``rope_parameters`` carry the scaling and call
``ROPE_INIT_FUNCTIONS[type](config, None, seq_len=...)`` (plain RoPE:
``LlamaRotaryEmbedding.compute_default_rope_parameters``). Comparisons are exact (atol=0).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch

from nanoattn.positional.rope_scaling import (
    SCALINGS,
    normalize_rope_scaling,
    rope_depends_on_length,
    rope_frequencies,
    yarn_attention_factor,
    yarn_correction_range,
)
from nanoattn.positional.rope_scaling_params import SCALING_TYPES

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

DIMS = (16, 64, 128)
THETAS = (10_000.0, 500_000.0)
FACTORS = (2.0, 4.0, 8.0)
GRID = list(itertools.product(DIMS, THETAS, FACTORS))
ORIGINAL = 2048


def exact(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)


def unscaled(dim: int, theta: float) -> torch.Tensor:
    return rope_frequencies(dim, theta, None)[0]


def hf_config(dim: int, theta: float, params: dict[str, Any] | None) -> LlamaConfig:
    """A LlamaConfig carrying our normalised ``params`` in transformers' spelling."""
    if params is None:
        return LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim,
                           max_position_embeddings=ORIGINAL, rope_parameters={"rope_type": "default",
                                                                               "rope_theta": theta})
    kind, original = params["type"], params["original_max_seq_len"]
    rope = {"rope_type": kind, "rope_theta": theta, "factor": params["factor"]}
    if kind in ("yarn", "llama3"):  # dynamic reads the original length from max_position_embeddings
        rope["original_max_position_embeddings"] = original
    rope.update({k: v for k, v in params.items()
                 if k not in ("type", "factor", "original_max_seq_len") and v is not None})
    # The extended length is factor x original, except for dynamic (see above).
    max_positions = original if kind == "dynamic" else round(original * params["factor"])
    return LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim,
                       max_position_embeddings=max_positions, rope_parameters=rope)


def theirs(dim: int, theta: float, params: dict[str, Any] | None, seq_len=None) -> tuple[torch.Tensor, float]:
    config = hf_config(dim, theta, params)
    if params is None:
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[params["type"]](config, None, seq_len=seq_len)


def check_parity(dim: int, theta: float, scaling: dict[str, Any], seq_len=None) -> None:
    params = normalize_rope_scaling(scaling, ORIGINAL)
    inv_freq, attention = rope_frequencies(dim, theta, params, seq_len=seq_len)
    ref_inv_freq, ref_attention = theirs(dim, theta, params, seq_len=seq_len)
    assert inv_freq.shape == (dim // 2,)
    exact(inv_freq, ref_inv_freq)
    assert attention == ref_attention


# ----------------------------------------------------------------------------- parity


@pytest.mark.parametrize("dim,theta", list(itertools.product(DIMS, THETAS)))
def test_unscaled_matches_transformers(dim: int, theta: float) -> None:
    inv_freq, attention = rope_frequencies(dim, theta, None)
    ref, ref_attention = theirs(dim, theta, None)
    exact(inv_freq, ref)
    assert attention == ref_attention == 1.0


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_linear_matches_transformers(dim: int, theta: float, factor: float) -> None:
    check_parity(dim, theta, {"type": "linear", "factor": factor})


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_llama3_matches_transformers(dim: int, theta: float, factor: float) -> None:
    check_parity(dim, theta, {"type": "llama3", "factor": factor})
    check_parity(dim, theta, {"type": "llama3", "factor": factor, "low_freq_factor": 2,
                              "high_freq_factor": 8, "original_max_seq_len": 8192})


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_yarn_matches_transformers(dim: int, theta: float, factor: float) -> None:
    check_parity(dim, theta, {"type": "yarn", "factor": factor})
    check_parity(dim, theta, {"type": "yarn", "factor": factor, "original_max_seq_len": 512})


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_dynamic_matches_transformers(dim: int, theta: float, factor: float) -> None:
    for seq_len in (None, 1, ORIGINAL // 2, ORIGINAL, ORIGINAL + 1, 2 * ORIGINAL, 3 * ORIGINAL + 7,
                    8 * ORIGINAL, 32 * ORIGINAL):
        check_parity(dim, theta, {"type": "dynamic", "factor": factor}, seq_len=seq_len)


@pytest.mark.parametrize("scaling", [
    {"type": "yarn", "factor": 4.0, "beta_fast": 16, "beta_slow": 2},
    {"type": "yarn", "factor": 32.0, "original_max_seq_len": 4096, "truncate": False},  # gpt-oss
    {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0},  # DeepSeek-V3
    {"type": "yarn", "factor": 40.0, "mscale": 0.707, "mscale_all_dim": 1.0},
    {"type": "yarn", "factor": 4.0, "attention_factor": 1.25},
    {"type": "yarn", "factor": 1.0},
    {"type": "yarn", "factor": 3.0, "original_max_seq_len": 128},  # low end clamped to pair 0
    {"type": "yarn", "factor": 4.0, "original_max_seq_len": 131072},  # high end past the last pair
    {"type": "yarn", "factor": 2.0, "original_max_seq_len": 4},  # both ends clamped to 0: a step
    {"type": "llama3", "factor": 1.0},
    {"type": "linear", "factor": 1.5},
    {"type": "dynamic", "factor": 1.7},
], ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
@pytest.mark.parametrize("dim,theta", [(64, 10_000.0), (128, 150_000.0)])
def test_variants_match_transformers(scaling: dict[str, Any], dim: int, theta: float) -> None:
    check_parity(dim, theta, scaling, seq_len=5 * ORIGINAL)


@pytest.mark.parametrize("dim,theta,scaling", [
    (128, 500_000.0, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                      "original_max_position_embeddings": 8192}),  # Llama 3.1 config.json
    (128, 1_000_000.0, {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}),  # Qwen2.5
    (64, 150_000.0, {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                     "original_max_position_embeddings": 4096, "truncate": False}),  # gpt-oss
    (64, 10_000.0, {"type": "yarn", "factor": 40, "beta_fast": 32, "beta_slow": 1, "mscale": 1.0,
                    "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}),  # DeepSeek-V3
])
def test_published_configs_match_transformers(dim: int, theta: float, scaling: dict[str, Any]) -> None:
    check_parity(dim, theta, scaling)


def test_dynamic_tensor_seq_len_in_transformers_is_float32_close() -> None:
    # transformers' model forward passes seq_len as a tensor, which makes its base float32;
    # with an int (what we mirror) the base is float64. The two differ by float32 rounding only.
    params = normalize_rope_scaling({"type": "dynamic", "factor": 4.0}, ORIGINAL)
    for dim, theta in itertools.product(DIMS, THETAS):
        for seq_len in (ORIGINAL + 1, 5000, 100_000):
            ours = rope_frequencies(dim, theta, params, seq_len=seq_len)[0]
            ref = theirs(dim, theta, params, seq_len=torch.tensor(seq_len))[0]
            torch.testing.assert_close(ours, ref, rtol=1e-6, atol=0)


# ----------------------------------------------------------------------------- formulas


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_ntk_closed_formula(dim: int, theta: float, factor: float) -> None:
    params = normalize_rope_scaling({"type": "ntk", "factor": factor}, ORIGINAL)
    inv_freq, attention = rope_frequencies(dim, theta, params)
    base = theta * factor ** (dim / (dim - 2))
    exact(inv_freq, 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    assert attention == 1.0
    plain = unscaled(dim, theta)
    assert inv_freq[0] == plain[0] == 1.0  # the fastest pair is untouched
    torch.testing.assert_close(inv_freq[-1], plain[-1] / factor, rtol=1e-6, atol=0)  # slowest: / factor


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_ntk_relation_to_transformers_dynamic(dim: int, theta: float, factor: float) -> None:
    ntk = rope_frequencies(dim, theta, normalize_rope_scaling({"type": "ntk", "factor": factor}, ORIGINAL))[0]
    # dynamic(factor=1) at L = factor * L0: the effective scale is L / L0 = factor.
    dyn1 = normalize_rope_scaling({"type": "dynamic", "factor": 1.0}, ORIGINAL)
    exact(ntk, theirs(dim, theta, dyn1, seq_len=int(factor * ORIGINAL))[0])
    # dynamic(factor=f) at L = L0 (2f - 1) / f: f L / L0 - (f - 1) = f.
    dyn = normalize_rope_scaling({"type": "dynamic", "factor": factor}, ORIGINAL)
    exact(ntk, theirs(dim, theta, dyn, seq_len=int(ORIGINAL * (2 * factor - 1) / factor))[0])
    # ...but not dynamic(factor=f) at L = f * L0, whose scale is f ** 2 - f + 1.
    assert not torch.equal(ntk, theirs(dim, theta, dyn, seq_len=int(factor * ORIGINAL))[0])


def test_linear_divides_every_frequency() -> None:
    params = normalize_rope_scaling({"type": "linear", "factor": 4}, ORIGINAL)
    exact(rope_frequencies(64, 10_000.0, params)[0], unscaled(64, 10_000.0) / 4)


@pytest.mark.parametrize("dim,theta,factor", GRID)
def test_dynamic_is_unscaled_within_original_length(dim: int, theta: float, factor: float) -> None:
    params = normalize_rope_scaling({"type": "dynamic", "factor": factor}, ORIGINAL)
    for seq_len in (None, 1, ORIGINAL - 1, ORIGINAL):
        exact(rope_frequencies(dim, theta, params, seq_len=seq_len)[0], unscaled(dim, theta))
    longer = rope_frequencies(dim, theta, params, seq_len=ORIGINAL + 1)[0]
    assert (longer[1:] < unscaled(dim, theta)[1:]).all()  # the base grew


@pytest.mark.parametrize("dim,theta,factor", GRID)
@pytest.mark.parametrize("beta_fast,beta_slow,original", [(32, 1, 2048), (16, 2, 4096), (32, 1, 128),
                                                               (32, 1, 131072)])
def test_yarn_ramp_boundaries_and_direction(dim: int, theta: float, factor: float, beta_fast: float,
                                            beta_slow: float, original: int) -> None:
    def pair_index(beta: float) -> float:  # the YaRN paper's d(r) = d ln(L0 / (2 pi r)) / (2 ln theta)
        return dim * math.log(original / (beta * 2 * math.pi)) / (2 * math.log(theta))

    low, high = yarn_correction_range(dim, theta, beta_fast, beta_slow, original)
    expected = max(math.floor(pair_index(beta_fast)), 0), min(math.ceil(pair_index(beta_slow)), dim - 1)
    assert (low, high) == expected
    assert yarn_correction_range(dim, theta, beta_fast, beta_slow, original, truncate=False) == (
        max(pair_index(beta_fast), 0), min(pair_index(beta_slow), dim - 1))

    params = normalize_rope_scaling({"type": "yarn", "factor": factor, "beta_fast": beta_fast,
                                     "beta_slow": beta_slow, "original_max_seq_len": original}, ORIGINAL)
    inv_freq = rope_frequencies(dim, theta, params)[0]
    plain = unscaled(dim, theta)
    pairs = torch.arange(dim // 2)
    fast, slow = pairs <= low, pairs >= high  # ramp 0 at low, 1 at high
    exact(inv_freq[fast], plain[fast])  # high-frequency pairs extrapolate: original frequency
    torch.testing.assert_close(inv_freq[slow], plain[slow] / factor, rtol=1e-6, atol=0)  # interpolated
    ratio = inv_freq / plain  # goes from 1 down to 1 / factor across the ramp
    assert (ratio[1:] <= ratio[:-1] * (1 + 1e-6)).all()


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 16.0, 40.0])
def test_yarn_attention_factor(factor: float) -> None:
    expected = 1.0 if factor == 1.0 else 0.1 * math.log(factor) + 1.0
    params = normalize_rope_scaling({"type": "yarn", "factor": factor}, ORIGINAL)
    assert rope_frequencies(64, 10_000.0, params)[1] == pytest.approx(expected, rel=1e-15)
    assert yarn_attention_factor(factor, 1.5) == 1.5
    ratio = (0.1 * 0.5 * math.log(factor) + 1) / (0.1 * 1.0 * math.log(factor) + 1)
    assert yarn_attention_factor(factor, mscale=0.5, mscale_all_dim=1.0) == pytest.approx(ratio, rel=1e-15)


@pytest.mark.parametrize("factor", [2.0, 8.0, 32.0])
def test_llama3_bands(factor: float) -> None:
    dim, theta, original, low, high = 128, 500_000.0, 8192, 1.0, 4.0
    params = normalize_rope_scaling({"type": "llama3", "factor": factor, "original_max_seq_len": original}, 1)
    inv_freq = rope_frequencies(dim, theta, params)[0]
    plain = unscaled(dim, theta)
    wavelength = 2 * math.pi / plain
    long, short = wavelength > original / low, wavelength < original / high
    middle = ~long & ~short
    assert long.any() and short.any() and middle.any()
    exact(inv_freq[long], plain[long] / factor)
    exact(inv_freq[short], plain[short])
    smooth = (original / wavelength[middle] - low) / (high - low)
    torch.testing.assert_close(inv_freq[middle], ((1 - smooth) / factor + smooth) * plain[middle],
                               rtol=1e-6, atol=0)
    ratio = inv_freq / plain  # continuous-ish and monotone: 1 on short wavelengths, 1 / factor on long
    assert (ratio[1:] <= ratio[:-1]).all()


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn", "llama3"])
def test_factor_one_is_identity(kind: str) -> None:
    params = normalize_rope_scaling({"type": kind, "factor": 1}, ORIGINAL)
    for dim, theta in itertools.product(DIMS, THETAS):
        inv_freq, attention = rope_frequencies(dim, theta, params, seq_len=10 * ORIGINAL)
        torch.testing.assert_close(inv_freq, unscaled(dim, theta), rtol=1e-7, atol=0)
        assert attention == 1.0


# ----------------------------------------------------------------------------- precision


@pytest.mark.parametrize("kind", [None, "linear", "ntk", "dynamic", "yarn", "llama3"])
def test_float32_from_int64_arange_even_under_autocast_and_float64_default(kind: str | None) -> None:
    params = None if kind is None else normalize_rope_scaling({"type": kind, "factor": 4.0}, ORIGINAL)
    reference = rope_frequencies(128, 500_000.0, params, seq_len=3 * ORIGINAL)[0]
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inv_freq = rope_frequencies(128, 500_000.0, params, seq_len=3 * ORIGINAL)[0]
    finally:
        torch.set_default_dtype(previous)
    assert inv_freq.dtype == torch.float32
    exact(inv_freq, reference)
    if kind is None:
        exponent = torch.arange(0, 128, 2, dtype=torch.float64) / 128
        torch.testing.assert_close(reference, (1.0 / 500_000.0 ** exponent).float(), rtol=2e-7, atol=0)


def test_device_argument() -> None:
    params = normalize_rope_scaling({"type": "yarn", "factor": 4.0}, ORIGINAL)
    inv_freq, _ = rope_frequencies(64, 10_000.0, params, device="cpu")
    assert inv_freq.device == torch.device("cpu")


# ----------------------------------------------------------------------------- normalisation


def test_defaults_are_filled() -> None:
    assert normalize_rope_scaling(None, ORIGINAL) is None
    assert normalize_rope_scaling({"type": "linear", "factor": 4}, 256) == {
        "type": "linear", "factor": 4.0, "original_max_seq_len": 256}
    assert normalize_rope_scaling({"type": "yarn", "factor": 4}, 256) == {
        "type": "yarn", "factor": 4.0, "original_max_seq_len": 256, "beta_fast": 32.0, "beta_slow": 1.0,
        "attention_factor": None, "mscale": None, "mscale_all_dim": None, "truncate": True}
    assert normalize_rope_scaling({"type": "llama3", "factor": 8, "original_max_seq_len": 8192}, 256) == {
        "type": "llama3", "factor": 8.0, "original_max_seq_len": 8192, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0}


def test_transformers_spellings_are_renamed() -> None:
    hf = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    ours = normalize_rope_scaling(hf, 256)
    assert ours["type"] == "yarn" and ours["original_max_seq_len"] == 32768
    assert "rope_type" not in ours and "original_max_position_embeddings" not in ours
    both = {"type": "yarn", "rope_type": "yarn", "factor": 4.0, "original_max_seq_len": 32768,
            "original_max_position_embeddings": 32768}  # agreeing duplicates, as old HF configs have
    assert normalize_rope_scaling(both, 256) == ours


@pytest.mark.parametrize("scaling", [
    {"type": "linear", "factor": 2}, {"type": "ntk", "factor": 3.5}, {"type": "dynamic", "factor": 2},
    {"type": "yarn", "factor": 8, "mscale": 0.7, "mscale_all_dim": 0.7, "truncate": False},
    {"type": "yarn", "factor": 8, "attention_factor": 1.1}, {"type": "llama3", "factor": 8},
])
def test_normalize_is_idempotent_and_plain(scaling: dict[str, Any]) -> None:
    once = normalize_rope_scaling(scaling, 512)
    assert normalize_rope_scaling(once, 512) == once
    assert type(once) is dict


def test_accepts_omegaconf_mappings() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"type": "yarn", "factor": 4, "beta_fast": 16})
    out = normalize_rope_scaling(cfg, 256)
    assert type(out) is dict and out["beta_fast"] == 16.0


def test_depends_on_length_only_for_dynamic() -> None:
    assert rope_depends_on_length(normalize_rope_scaling({"type": "dynamic", "factor": 2}, 256))
    assert not rope_depends_on_length(None)
    for kind in ("linear", "ntk", "yarn", "llama3"):
        assert not rope_depends_on_length(normalize_rope_scaling({"type": kind, "factor": 2}, 256))


# ----------------------------------------------------------------------------- validation

ALLOWED = "linear | ntk | dynamic | yarn | llama3 | longrope"


@pytest.mark.parametrize("scaling,message", [
    ({"type": "foo", "factor": 2}, f"model.rope_scaling.type='foo' is invalid: allowed: {ALLOWED}"),
    ({"type": "linear", "factor": 0.5}, "model.rope_scaling.factor=0.5 is invalid: must be >= 1"),
])
def test_error_messages_verbatim(scaling: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as info:
        normalize_rope_scaling(scaling, 256)
    assert str(info.value) == message


@pytest.mark.parametrize("scaling,key", [
    ("linear", "model.rope_scaling="),
    ({"factor": 2}, "type"),
    ({"type": ["linear"], "factor": 2}, "type"),
    ({"type": "linear"}, "factor"),
    ({"type": "linear", "factor": "2"}, "factor"),
    ({"type": "linear", "factor": True}, "factor"),
    ({"type": "linear", "factor": float("nan")}, "factor"),
    ({"type": "ntk", "factor": float("inf")}, "factor"),
    ({"type": "dynamic", "factor": 0.99}, "factor"),
    ({"type": "linear", "factor": 2, "beta_fast": 32}, "beta_fast"),
    ({"type": "yarn", "factor": 2, "low_freq_factor": 1}, "low_freq_factor"),
    ({"type": "yarn", "factor": 2, "rope_theta": 10000.0}, "rope_theta"),
    ({"type": "linear", "factor": 2, "original_max_seq_len": 0}, "original_max_seq_len"),
    ({"type": "linear", "factor": 2, "original_max_seq_len": 2048.0}, "original_max_seq_len"),
    ({"type": "linear", "factor": 2, "original_max_position_embeddings": -1}, "original_max_seq_len"),
    ({"type": "yarn", "factor": 2, "beta_fast": 1, "beta_slow": 32}, "beta_fast"),
    ({"type": "yarn", "factor": 2, "beta_slow": 0}, "beta_slow"),
    ({"type": "yarn", "factor": 2, "beta_fast": None}, "beta_fast"),
    ({"type": "yarn", "factor": 2, "attention_factor": -1.0}, "attention_factor"),
    ({"type": "yarn", "factor": 2, "attention_factor": 0}, "attention_factor"),
    ({"type": "yarn", "factor": 2, "mscale": 0.7}, "mscale"),
    ({"type": "yarn", "factor": 2, "mscale_all_dim": 0.7}, "mscale_all_dim"),
    ({"type": "yarn", "factor": 2, "mscale": -1, "mscale_all_dim": 1}, "mscale"),
    ({"type": "yarn", "factor": 2, "attention_factor": 1.1, "mscale": 1, "mscale_all_dim": 1},
     "attention_factor"),
    ({"type": "yarn", "factor": 2, "truncate": "no"}, "truncate"),
    ({"type": "llama3", "factor": 8, "low_freq_factor": 4, "high_freq_factor": 1}, "high_freq_factor"),
    ({"type": "llama3", "factor": 8, "low_freq_factor": 0}, "low_freq_factor"),
    ({"type": "yarn", "rope_type": "linear", "factor": 2}, "rope_type"),
    ({"type": "yarn", "factor": 2, "original_max_seq_len": 1024, "original_max_position_embeddings": 2048},
     "original_max_position_embeddings"),
], ids=str)
def test_bad_mappings_name_the_key(scaling: Any, key: str) -> None:
    with pytest.raises(ValueError) as info:
        normalize_rope_scaling(scaling, 256)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("model.rope_scaling")
    assert (key if key.startswith("model.") else f"model.rope_scaling.{key}") in message


@pytest.mark.parametrize("dim,theta,scaling", [
    (63, 10_000.0, None), (0, 10_000.0, None), (64, 0.0, None), (64, -1.0, None),
    (2, 10_000.0, {"type": "ntk", "factor": 2.0}),
    (64, 1.0, {"type": "yarn", "factor": 2.0}),
    (64, 10_000.0, {"type": "foo"}),
])
def test_rope_frequencies_rejects_bad_arguments(dim: int, theta: float, scaling: Any) -> None:
    if scaling is not None and scaling["type"] != "foo":
        scaling = normalize_rope_scaling(scaling, ORIGINAL)
    with pytest.raises(ValueError):
        rope_frequencies(dim, theta, scaling)


def test_validation_and_frequencies_know_the_same_types():
    assert tuple(SCALINGS) == SCALING_TYPES
