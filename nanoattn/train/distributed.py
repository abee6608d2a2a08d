"""Process-group setup and the few collectives the training loop needs.

Design choices:
- ``torchrun`` is the launcher (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT); without
  it, or with WORLD_SIZE=1, everything here is a no-op and no process group is created.
- gloo on CPU, NCCL on CUDA; each rank uses GPU ``LOCAL_RANK``.
- Only rank 0 writes files (config, metrics, checkpoints). Values that must be the same on every
  rank but may differ when each rank computes them (the run directory, from Hydra's ``${now:}``)
  are decided by rank 0 and broadcast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    owns_group: bool = False  # created here, so shutdown() destroys it (a caller's group is left alone)

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launched_world_size() -> int:
    """How many processes torchrun started for this run (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device_type: str) -> Dist:
    """Join the torchrun process group (gloo on CPU, NCCL on CUDA); a 1-process Dist otherwise."""
    world_size = launched_world_size()
    if world_size <= 1:
        return Dist()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")
    return Dist(rank, world_size, local_rank, owns)


def shutdown(d: Dist) -> None:
    if d.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def broadcast_object(d: Dist, value: Any) -> Any:
    """Rank 0's ``value`` on every rank (small picklable objects between our own processes)."""
    if not d.enabled:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(d: Dist, value: Any) -> list[Any]:
    """Every rank's ``value``, in rank order, on every rank."""
    if not d.enabled:
        return [value]
    out: list[Any] = [None] * d.world_size
    dist.all_gather_object(out, value)
    return out


def all_reduce_sum(d: Dist, tensor: torch.Tensor) -> torch.Tensor:
    """The sum over ranks, in place (a no-op on one process)."""
    if d.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def any_rank(d: Dist, flag: bool, device: torch.device) -> bool:
    """True on every rank when ``flag`` is true on at least one (e.g. a signal seen by one rank)."""
    if not d.enabled:
        return flag
    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def barrier(d: Dist) -> None:
    if d.enabled:
        dist.barrier()
