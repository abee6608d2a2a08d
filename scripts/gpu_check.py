"""``make gpu-check``: what depends on the device, on this machine's CUDA GPU; one line where there is none.

With CUDA, in order, each a command of its own (the first failure ends the check, exit status 1):

1. the device tests: ``pytest -m "device or gpu" --device=cuda tests/train/test_device.py``
   (cached decoding, bf16 autocast training, a compiled step; DDP over NCCL where two GPUs are);
2. 200 steps of ``model=llama-124m recipe=gpu`` on the default corpus, into
   ``runs/gpu_check/<time>/train``, its tokens/s read from the run's metrics;
3. the bench's ``train``, ``mfu`` and ``decode`` sections on that model in bf16: tokens/s, MFU
   against the GPU's measured bf16 matmul peak and decoding speed, on the page
   ``runs/gpu_check/<time>/bench.md``.

Without a CUDA device it says so in one line and exits 0. None of it has run on a GPU yet.
"""

import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
TRAIN_STEPS = 200


def no_device_line() -> str:
    build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
    return f"gpu-check: no CUDA device visible to torch {torch.__version__} ({build}); nothing to check"


def commands(out: Path, gpus: int) -> list[tuple[str, list[str]]]:
    """(what, command) of each stage on a machine of ``gpus`` GPUs, run from the repository's root."""
    python = sys.executable
    tests = "device or gpu" if gpus >= 2 else "device or (gpu and not two_gpus)"
    return [
        ("device tests", [python, "-m", "pytest", "-n", "0", "-m", tests, "--device=cuda",
                          "tests/train/test_device.py"]),
        (f"{TRAIN_STEPS} steps of llama-124m", [python, "scripts/train.py", "model=llama-124m", "recipe=gpu",
                                                 f"train.max_steps={TRAIN_STEPS}", "train.eval_interval=0",
                                                 "train.device=cuda", f"out_dir={out / 'train'}"]),
        ("bench", [python, "scripts/bench.py", "only=[train,mfu,decode]", "device=cuda", "dtype=bfloat16",
                   "model=llama-124m", "decode_model=llama-124m", "quick=true", f"out={out}"]),
    ]


def main() -> int:
    if not torch.cuda.is_available():
        print(no_device_line())
        return 0
    out = REPO / "runs" / "gpu_check" / time.strftime("%Y-%m-%d_%H-%M-%S")
    for what, command in commands(out, torch.cuda.device_count()):
        print(f"gpu-check: {what}: {' '.join(command[1:])}", flush=True)
        if subprocess.run(command, cwd=REPO).returncode != 0:
            print(f"gpu-check: {what} failed (above)", file=sys.stderr)
            return 1
    metrics = (out / "train" / "metrics.jsonl").read_text().splitlines()
    print(f"gpu-check: passed on {torch.cuda.get_device_name()}; the training's last record: {metrics[-1]}; "
          f"tokens/s, MFU and decoding: {out / 'bench.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
