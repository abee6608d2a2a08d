"""The paths that depend on the device, on the one ``--device`` names: the CPU in the suite, CUDA
under ``make gpu-check`` (scripts/gpu_check.py), which also runs the ``gpu`` tests the suite
deselects: a compiled step, and DDP over NCCL where two GPUs are. None of them has run on a GPU yet."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from nanoattn import GPT, ModelConfig
from nanoattn.generate import Decoding
from nanoattn.logging import read_metrics
from nanoattn.train import train

pytestmark = pytest.mark.device
PROMPT, NEW = 8, 24


@pytest.mark.parametrize("pos", ["rope", "alibi"])
def test_cached_decoding_on_the_device_equals_recomputation(pos, device):
    """Each cached step's logits equal the whole sequence recomputed, through a rotation and through a
    bias (every encoding on the CPU: tests/test_generate.py); float32 kernels sum in their own order at
    each shape (one query against many on CUDA), so within 1e-4, not to the bit."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64,
                            max_seq_len=PROMPT + NEW, pos=pos)).to(device).eval()
    idx = torch.randint(0, 64, (2, PROMPT), generator=torch.Generator().manual_seed(1)).to(device)
    decoding = Decoding(model, idx, NEW, temperature=0)
    for step, _ in enumerate(decoding):
        with torch.no_grad():
            recomputed = model(decoding.idx[:, :PROMPT + step])[:, -1]
        torch.testing.assert_close(decoding.last_logits, recomputed, atol=1e-4, rtol=1e-4)
    assert decoding.idx.shape == (2, PROMPT + NEW) and decoding.idx.device.type == device.type


def losses(run) -> list[float]:
    return [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]


def test_bf16_autocast_trains_on_the_device_as_float32_does(tmp_path, tiny_config, device):
    """Under bf16 autocast the first loss is float32's within bf16's rounding of the logits (a relative
    2^-8 per value, 1% over the reductions here), and the run learns as float32's does."""
    runs = {dtype: train(tiny_config(tmp_path / dtype, device=device.type, dtype=dtype, max_steps=12,
                                     log_interval=1, eval_interval=0, ckpt_interval=0))
            for dtype in ("float32", "bfloat16")}
    bf16, fp32 = losses(runs["bfloat16"]), losses(runs["float32"])
    assert bf16[0] == pytest.approx(fp32[0], rel=1e-2)
    assert bf16[-1] < bf16[0] - 0.1 and fp32[-1] < fp32[0] - 0.1


@pytest.mark.gpu
def test_a_compiled_step_on_the_device_trains_the_losses_of_the_eager_one(tmp_path, tiny_config, device):
    """As tests/train/test_loop.py's compiled run on the CPU: each loss within bf16's rounding unit."""
    runs = {compiled: train(tiny_config(tmp_path / str(compiled), device=device.type, dtype="bfloat16",
                                        compile=compiled, max_steps=6, log_interval=1, eval_interval=0,
                                        ckpt_interval=0))
            for compiled in (False, True)}
    assert losses(runs[True]) == pytest.approx(losses(runs[False]), rel=2**-8)


@pytest.mark.gpu
@pytest.mark.two_gpus
def test_ddp_over_nccl_matches_one_process(tmp_path, tiny_config, as_overrides, compare_runs, device):
    """Two processes of two sequences, one GPU each, against one process of four (the CPU's gloo
    version: tests/train/test_cli.py); float32, so within 1e-5 over six AdamW updates. make gpu-check
    selects it where two GPUs are."""
    gpus = torch.cuda.device_count()
    assert gpus >= 2, f"DDP over NCCL needs two GPUs; this machine has {gpus}"
    options = dict(device=device.type, batch_size=2, max_steps=6, eval_interval=2, ckpt_interval=0,
                   log_interval=1, schedule="constant", optimizer="adamw")
    script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "train.py")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script]
    done = subprocess.run([*torchrun, *as_overrides(tiny_config(tmp_path / "ddp", **options))],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    compare_runs(tmp_path / "ddp", train(tiny_config(tmp_path / "one", **{**options, "batch_size": 4})), 1e-5)
