"""Kernels chosen by measurement (``nanoattn.kernels``).

What is asserted:

- ``row_block_linear`` computes x W^T within the dot products' own rounding bound, the bound any
  summation order meets (so it holds on every CPU), for any number of row blocks dividing the rows;
- ``fastest_kernel`` times the candidates once, picks the faster, and remembers the choice in the
  process and in the cache file under the machine (CPU, torch, threads); a file that is unreadable
  or names a kernel no longer offered is measured again and rewritten;
- ``Linear`` asks for a choice only for few rows without autograd, once per shape, and computes
  F.linear's product either way (bias and leading dims included); with autograd or many rows it is
  F.linear bit for bit;
- ``causal_query_blocks`` scores each block of queries against only the keys it sees, and its bf16
  output differs from one block over every key by at most the softmax weights' bf16 rounding;
- ``bf16_matmuls_faster`` times both attention kernels through the backward pass, once per power
  of two of keys, without drawing from the global generator;
- none of this breaks a compiled graph: training and decoding steps trace whole.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from nanoattn import GPT, KVCache, ModelConfig, kernels
from nanoattn.kernels import (
    CAUSAL_QUERY_BLOCK,
    MEASURED_ROWS,
    Linear,
    causal_query_blocks,
    fastest_kernel,
    grouped_scores,
    grouped_values,
    row_block_linear,
)


def assert_within_dot_product_bound(ours: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                                    bias: torch.Tensor | None = None) -> None:
    """|ours - (x W^T + b)| <= gamma_n (|x| |W|^T + |b|) elementwise, gamma_n = n u / (1 - n u) for
    sums of n products in ours' dtype (unit roundoff u; the bias is one more term), whatever their
    order, with the exact result computed in float64. x [M, in], ours [M, out]."""
    n, u = x.shape[-1] + (bias is not None), torch.finfo(ours.dtype).eps / 2
    gamma = n * u / (1 - n * u)
    exact = x.double() @ weight.double().T
    bound = gamma * (x.double().abs() @ weight.double().abs().T)
    if bias is not None:
        exact, bound = exact + bias.double(), bound + gamma * bias.double().abs()
    assert ((ours.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("out,blocks", [(12, 1), (12, 2), (12, 3), (12, 4), (96, 8)])
def test_row_blocks_compute_the_product(rows, out, blocks):
    x, weight = torch.randn(rows, 40), torch.randn(out, 40)
    y = row_block_linear(x, weight, blocks)
    assert y.shape == (rows, out)
    assert_within_dot_product_bound(y, x, weight)


@pytest.fixture
def fresh_choices(fresh_attention_timings, monkeypatch, tmp_path):
    """An empty kernel-choice cache, in this process and on disk: the cache file's path."""
    monkeypatch.setenv("NANOATTN_CACHE", str(tmp_path))
    monkeypatch.setattr(kernels, "_kernel_choices", {})
    return tmp_path / kernels.KERNEL_CHOICES


def counting(calls: dict[str, int], name: str, seconds: float):
    def run() -> None:
        calls[name] += 1
        time.sleep(seconds)
    return run


def test_the_fastest_kernel_is_timed_once_and_remembered(fresh_choices, monkeypatch):
    calls = {"slow": 0, "fast": 0}
    candidates = {"slow": counting(calls, "slow", 0.005), "fast": counting(calls, "fast", 0)}
    assert fastest_kernel("op", "[2, 3]", candidates, repeats=3) == "fast"
    assert calls == {"slow": 3, "fast": 3}
    assert fastest_kernel("op", "[2, 3]", candidates) == "fast"  # this process remembers
    monkeypatch.setattr(kernels, "_kernel_choices", {})  # as a later process starts
    assert fastest_kernel("op", "[2, 3]", candidates) == "fast"  # the file remembers
    assert calls == {"slow": 3, "fast": 3}
    (machine, choices), = json.loads(fresh_choices.read_text()).items()
    assert f"torch {torch.__version__}" in machine and f"{torch.get_num_threads()} threads" in machine
    assert choices == {"op [2, 3]": "fast"}
    fastest_kernel("op", "[4, 3]", candidates, repeats=1)  # another shape is another measurement
    assert calls == {"slow": 4, "fast": 4}


def test_an_unreadable_file_or_an_entry_naming_no_kernel_is_measured_again_with_one_line(
        fresh_choices, monkeypatch, capsys):
    calls = {"slow": 0, "fast": 0}
    candidates = {"slow": counting(calls, "slow", 0.005), "fast": counting(calls, "fast", 0)}
    fresh_choices.write_text("{ not json")
    assert fastest_kernel("op", "[1]", candidates, repeats=1) == "fast"
    machine = next(iter(json.loads(fresh_choices.read_text())))
    # A retired kernel's name, and a list (which failed with "unhashable type" before).
    for entry in ("retired", ["fast"]):
        fresh_choices.write_text(json.dumps({machine: {"op [1]": entry}}))
        monkeypatch.setattr(kernels, "_kernel_choices", {})
        assert fastest_kernel("op", "[1]", candidates, repeats=1) == "fast"
    assert calls == {"slow": 3, "fast": 3}
    assert json.loads(fresh_choices.read_text()) == {machine: {"op [1]": "fast"}}
    fresh_choices.write_text(json.dumps({machine: ["op [1]"]}))  # a machine's entry that is no mapping
    monkeypatch.setattr(kernels, "_kernel_choices", {})
    assert fastest_kernel("op", "[1]", candidates, repeats=1) == "fast"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 4 and all(line.startswith(f"kernel choices {fresh_choices}") for line in lines)
    assert lines[2].endswith("'op [1]' is ['fast'], not one of slow | fast: measured again")


# Each process chooses a kernel for 30 shapes of its own, as fast as it can.
CHOOSE_MANY = """
import sys
from nanoattn.kernels import fastest_kernel
for shape in range(30):
    fastest_kernel("op", f"{sys.argv[1]} {shape}", {"a": lambda: None, "b": lambda: None}, repeats=1)
"""


def test_two_processes_choosing_at_once_keep_every_choice_in_the_file(fresh_choices):
    """The file is read, merged and replaced under a lock: without it, one process's replacement drops
    the choices the other wrote since its read."""
    processes = [subprocess.Popen([sys.executable, "-c", CHOOSE_MANY, name], env=dict(os.environ))
                 for name in ("first", "second")]
    assert [process.wait(timeout=60) for process in processes] == [0, 0]
    (choices,) = json.loads(fresh_choices.read_text()).values()
    assert len(choices) == 60


@pytest.mark.parametrize("choice", ["row blocks", "linear"])
def test_linear_asks_for_few_rows_without_autograd_and_computes_the_same(monkeypatch, choice):
    asked = []
    monkeypatch.setattr(kernels, "fastest_kernel",
                        lambda what, shape, candidates: asked.append(shape) or choice)
    layer = Linear(40, 12, bias=True)
    with torch.no_grad():
        layer.bias.normal_()
        x = torch.randn(2, 3, 40)
        y = layer(x)
        layer(torch.randn(2, 3, 40))
    assert asked == ["[6, 40] x [12, 40]^T float32"]  # once per shape
    assert y.shape == (2, 3, 12)
    if choice == "linear":
        assert torch.equal(y, F.linear(x, layer.weight, layer.bias))
    else:
        assert_within_dot_product_bound(y.view(6, 12), x.view(6, 40), layer.weight, layer.bias)
    with torch.no_grad():
        many = torch.randn(MEASURED_ROWS + 1, 40)
        assert torch.equal(layer(many), F.linear(many, layer.weight, layer.bias))
    trained = layer(x)
    assert trained.requires_grad and torch.equal(trained, F.linear(x, layer.weight, layer.bias))
    assert len(asked) == 1


def test_causal_query_blocks_score_only_the_keys_each_block_sees():
    """Each block of queries is scored against the keys up to its last query, with their causal mask,
    and the output is one block's over every key up to bf16 rounding: the blocks leave out only
    masked keys, whose weights are exactly 0, so they change no more than the order of the sums.
    Each softmax weight w then rounds within 2^-8 w, and the output sum_j w_j v_j within
    2^-8 sum_j w_j |v_j| <= 2^-8 max |v|, and again by 2^-8 |y| <= 2^-8 max |v| when rounded."""
    draws = torch.Generator().manual_seed(0)
    T = 2 * CAUSAL_QUERY_BLOCK + 22
    q, k, v = (torch.randn(2, n, T, 8, generator=draws).bfloat16() for n in (4, 2, 2))
    seen = []

    def attend(q, k, v, mask):
        seen.append((q.shape[2], k.shape[2], v.shape[2]))
        queries = torch.arange(k.shape[2] - mask.shape[0], k.shape[2])[:, None]
        assert torch.equal(mask == 0, torch.arange(k.shape[2]) <= queries)  # itself and the keys before
        return grouped_values(torch.softmax(grouped_scores(q, k) + mask, dim=-1), v)

    blocks = causal_query_blocks(q, k, v, attend)
    every_key = attend(q, k, v, torch.full((T, T), float("-inf"), dtype=torch.bfloat16).triu(1))
    block = CAUSAL_QUERY_BLOCK
    assert seen[:-1] == [(block, block, block), (block, 2 * block, 2 * block), (22, T, T)]
    assert blocks.shape == every_key.shape and blocks.dtype == torch.bfloat16
    assert (blocks.float() - every_key.float()).abs().max() <= 2 ** -7 * v.abs().max().float()


def test_attention_is_timed_once_per_power_of_two_of_keys_through_the_backward_pass(fresh_choices,
                                                                                    monkeypatch):
    """Both kernels run through the backward pass when asked (a wrong shape would raise), on random bf16
    inputs at the keys rounded up to a power of two, at least BF16_TIMED_MIN_TOKENS, without drawing
    from the global generator (a run's data and dropout draw from it)."""
    asked, timing = [], kernels.fastest_kernel
    monkeypatch.setattr(kernels, "fastest_kernel", lambda what, shape, candidates: asked.append(shape)
                        or timing(what, shape, candidates))
    assert kernels.BF16_TIMED_MIN_TOKENS == 64
    state = torch.random.get_rng_state()
    for keys in (33, 64, 65, 100, 128):
        assert isinstance(kernels.bf16_matmuls_faster(2, 4, 2, 8, keys, True), bool)
    assert torch.equal(torch.random.get_rng_state(), state)
    timed = [f"q [2, 4, {t}, 8] k [2, 2, {t}, 8] forward and backward" for t in (64, 128)]
    assert asked == timed
    assert sorted(next(iter(json.loads(fresh_choices.read_text()).values()))) == sorted(
        f"causal attention bf16 in query blocks {shape}" for shape in timed)


def test_the_kernel_choices_leave_compiled_graphs_whole(fresh_choices):
    """Under torch.compile the model traces as one graph, the choices asked while tracing: a training
    step's forward (bf16 autocast, autograd, the attention timing) and a decoding step's (no autograd,
    the KV cache, few rows)."""
    cfg = ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=64,
                      token_shift=True)
    model = GPT(cfg)
    idx = torch.randint(0, 64, (2, 64))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch._dynamo.explain(model.loss)(idx, idx).graph_break_count == 0
    cache = KVCache(cfg, 2, 64)
    with torch.no_grad():
        model.hidden_states(idx[:, :8], cache=cache)
        assert torch._dynamo.explain(model.hidden_states)(idx[:, 8:9], cache=cache).graph_break_count == 0
