"""A checkpoint's trainer state (``trainer_state.pt``): what it records, and how a resume takes it back.

Beside the weights, an exact resume needs what else decides the next step's numbers: the optimizer's
moments, the step (which fixes the batches and the rate), the open log window, every rank's RNG
streams, and the choices that change rounding, namely the thread count (kernels split their sums by
it) and the kernels measured on the machine (``nanoattn.kernels``). Those kernel choices are
taken back before the first step, so a kernel cache changed or deleted between the kill and the
resume cannot change a resumed run; a thread count that changed is announced, since it cannot be
taken back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from nanoattn.checkpoint import CheckpointError, read_checkpoint_config
from nanoattn.config import TrainConfig
from nanoattn.kernels import kernel_choices, take_kernel_choices
from nanoattn.train import distributed

REQUIRED = ("step", "optimizer", "rng", "window", "world_size")  # what a resumable state holds


def trainer_state(step: int, optimizer: torch.optim.Optimizer, rng: dict[str, list[torch.Tensor]],
                  window: dict[str, Any], t: TrainConfig, world_size: int) -> dict[str, Any]:
    """The trainer state after ``step`` updates (``rng``: ``gathered_rng_states``)."""
    return {"step": step, "optimizer": optimizer.state_dict(), "rng": rng, "window": window,
            "world_size": world_size, "batch_size": t.batch_size,
            "threads": torch.get_num_threads(), "kernel_choices": kernel_choices(),
            "data": {"seed": t.seed, "next_step": step},
            "schedule": {"name": t.schedule, "lr": t.lr, "min_lr": t.min_lr, "warmup_steps": t.warmup_steps,
                         "max_steps": t.max_steps, "decay_steps": t.decay_steps}}


def gathered_rng_states(dist: distributed.Dist, device: torch.device) -> dict[str, list[torch.Tensor]]:
    """Every rank's RNG states (a collective: every rank calls it)."""
    rng = {"cpu": distributed.gather_objects(dist, torch.get_rng_state())}
    if device.type == "cuda":
        rng["cuda"] = distributed.gather_objects(dist, torch.cuda.get_rng_state(device).cpu())
    return rng


def check_resumable(state: dict[str, Any], ckpt: Path, world_size: int, batch_size: int) -> None:
    """Refuse a trainer state this version cannot resume, or another number of rows per micro-step;
    then take its kernel choices (``take_kernel_choices``) before anything computes."""
    missing = [k for k in REQUIRED if k not in state]
    if missing:
        raise CheckpointError(f"{ckpt / 'trainer_state.pt'} lacks {', '.join(missing)}: not a trainer "
                              "state this version can resume")
    if int(state["step"]) != int(read_checkpoint_config(ckpt).get("step", -1)):
        raise CheckpointError(f"{ckpt}: trainer_state.pt and config.json disagree on the step")
    was, now = state["world_size"] * state["batch_size"], world_size * batch_size
    if was != now:
        raise ValueError(f"train.batch_size={batch_size} with {world_size} process(es) draws {now} sequences "
                         f"per micro-step; the run drew {was} (batch_size={state['batch_size']} x "
                         f"{state['world_size']}): keep the product")
    take_kernel_choices(state.get("kernel_choices", {}))  # a state from before the record has none


def seed_rngs(state: Mapping[str, Any] | None, seed: int, dist: distributed.Dist,
              device: torch.device) -> None:
    """Each rank its own dropout stream; a resumed run continues the saved one exactly."""
    if state is None:
        torch.manual_seed(seed + dist.rank)
        return
    rng = state["rng"]
    if len(rng["cpu"]) != dist.world_size:  # a new world size: new streams, seeded by the step
        torch.manual_seed(seed + dist.rank + 1_000_003 * int(state["step"]))
        return
    torch.set_rng_state(rng["cpu"][dist.rank])
    if device.type == "cuda" and rng.get("cuda"):
        torch.cuda.set_rng_state(rng["cuda"][dist.rank], device)


def thread_count_change(state: Mapping[str, Any], threads: int) -> str:
    """What a resume on ``threads`` threads should say of the run's own count at its last save: ""
    when they agree (or the state predates the record). Kernels split their sums by the thread
    count, so on another count the losses continue to rounding, not to the bit."""
    saved = state.get("threads")
    if saved is None or saved == threads:
        return ""
    return (f"; on {threads} thread(s) where it saved on {saved}, so its losses continue to rounding, not to "
            f"the bit (OMP_NUM_THREADS={saved} resumes it exactly)")
