"""What a model needs in memory, known before allocating: the weights' lower bound holds for every
variant and encoding, a config of 10**8 layers is refused without building a block, and the
activation bound is below what a forward pass really holds."""

from __future__ import annotations

import time

import pytest
import torch

from nanoattn import GPT, ModelConfig, runtime
from nanoattn.config import PRESETS
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.model import activation_bytes, check_forward_fits, meta_model, weights_at_least

BASE = dict(vocab_size=96, d_model=32, n_layer=4, n_head=4, n_kv_head=2, max_seq_len=32)


def config(**fields) -> ModelConfig:
    return ModelConfig(**{**BASE, **fields})


@pytest.mark.parametrize("fields", [
    *(dict(PRESETS[name], max_seq_len=64) for name in ("gpt-tiny", "llama-tiny", "llama-small")),
    *(dict(BASE, **variant) for variant in ATTENTION_VARIANTS.values()),
    *(dict(BASE, **encoding) for encoding in encoding_options().values()),
    dict(BASE, mlp="relu2", mla_kv_rank=16, mla_q_rank=8, n_kv_head=None),
], ids=lambda fields: "-".join(f"{k}={v}" for k, v in fields.items() if k not in BASE or v != BASE[k])[:60])
def test_the_weights_lower_bound_holds_for_every_variant_and_encoding(fields):
    cfg = ModelConfig(**fields)
    with torch.device("meta"):
        exact = GPT(cfg).num_params()
    assert weights_at_least(cfg) <= exact
    assert meta_model(cfg).num_params() == exact


def test_a_config_of_1e8_layers_is_checked_and_refused_without_building_a_block(monkeypatch):
    monkeypatch.setattr(runtime.device, "memory_bytes", lambda device: 16 * 2**30)
    began = time.perf_counter()
    cfg = config(n_layer=100_000_000, pos=["rope", "nope"], sliding_window=[16, None])  # validation: cheap
    refusal = (r"^model\.n_layer=100000000 is invalid: a model of n_layer=100,000,000, d_model=32, "
               r"vocab_size=96 needs at least [\d,.]+ GiB, more than the 16\.0 GiB of cpu$")
    with pytest.raises(ValueError, match=refusal):
        meta_model(cfg)
    assert time.perf_counter() - began < 1.0
    with pytest.raises(ValueError, match=r"^x\.vocab_size=10000000000 is invalid"):  # the largest field named
        meta_model(config(vocab_size=10**10), owner="x")


def test_the_exact_count_refuses_what_the_bound_lets_through(monkeypatch):
    cfg = config(value_embeds=2)  # two extra token tables the bound does not count
    with torch.device("meta"):
        exact = GPT(cfg).num_params()
    monkeypatch.setattr(runtime.device, "memory_bytes",
                        lambda device: 4 * (weights_at_least(cfg) + exact) // 2)
    with pytest.raises(ValueError, match=rf"a model of .* \({exact:,} parameters\) needs [\d.]+ GiB"):
        meta_model(cfg)


def test_activation_bytes_is_below_what_a_forward_pass_holds():
    """The residual stream entering an MLP and the MLP's hidden layer are alive together; under bf16
    autocast the stream stays float32 and the hidden layer is bf16, so the bound's 2 bytes an
    element is below both."""
    cfg = config()
    model, seen = GPT(cfg).eval(), {}
    block = model.blocks[0]
    block.mlp.down.register_forward_hook(lambda m, args, out: seen.update(hidden=args[0].nbytes))
    block.mlp_norm.register_forward_hook(lambda m, args, out: seen.update(stream=args[0].nbytes))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(torch.zeros(3, 20, dtype=torch.long))
    assert activation_bytes(cfg, 3 * 20) <= seen["stream"] + seen["hidden"]
    assert activation_bytes(cfg, 60, training=True) == cfg.n_layer * activation_bytes(cfg, 60)


def test_a_forward_pass_that_cannot_fit_names_its_key(monkeypatch):
    monkeypatch.setattr(runtime.device, "memory_bytes", lambda device: 2**30)
    cfg = config()
    check_forward_fits(cfg, 8, 1024, torch.device("cpu"), ("eval_length", "lengths", [1024]))
    refusal = (r"^eval_length\.lengths=\[10000000\] is invalid: a forward pass over 8 x 10,000,000 tokens "
               r"needs at least [\d.]+ GiB, more than the 1\.0 GiB")
    with pytest.raises(ValueError, match=refusal):
        check_forward_fits(cfg, 8, 10_000_000, torch.device("cpu"), ("eval_length", "lengths", [10_000_000]))
