"""One optimizer update, the code the training loop runs and ``nanoattn.bench`` times.

``LossModule`` puts ``GPT.loss`` behind a ``forward``, the only call DDP sees, so DDP syncs the
gradients; ``wrap_for_training`` adds DDP and torch.compile (its kernels cached across runs,
``nanoattn.runtime.use_compile_cache``, and deterministic, ``use_deterministic_compilation``) as
the run asks. ``optimizer_step`` runs the micro-batches of one update (DDP all-reduces only on the
last one), clips the global gradient norm, steps, and has every positional encoding project its
parameters back into range (``project_parameters``: part of the update and deterministic, so a
resumed run repeats it).
Nothing here synchronises with the device: the loss sum and the norm stay tensors, read by the
caller once per log window.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from nanoattn.config import RunConfig
from nanoattn.data.tasks import row_inputs
from nanoattn.model import GPT, check_forward_fits, meta_model
from nanoattn.positional import PositionalEncoding
from nanoattn.runtime import check_fits, use_compile_cache, use_deterministic_compilation
from nanoattn.tasks import TASKS
from nanoattn.validation import declared_defaults, largest_departure

TOKEN_BYTES = 8  # int64 ids: a batch's inputs and targets
DEFAULTS = declared_defaults(RunConfig)


def check_step_fits(cfg: RunConfig, device: torch.device) -> None:
    """Refuse, before any data is read or any weight allocated, a run whose model or training step
    cannot fit ``device`` (``nanoattn.model.memory``): the weights, then their gradients and a
    step's activations over batch_size x seq_len tokens with the step's grad_accum micro-batches,
    seq_len a task run's largest row when the task sets it; then the eval_steps validation batches
    a run keeps. The error names the option further above its default: the batch, the micro-batches,
    or the length's source (``task.train_length``, ``train.seq_len``, ``model.max_seq_len``)."""
    meta_model(cfg.model, device)
    t, task = cfg.train, cfg.task
    if task.name is not None and t.seq_len is None:
        seq_len = row_inputs(task.build(), task.train_length)
        length = ("task", "train_length", task.train_length, TASKS[task.name].train_length)
    else:
        seq_len, usual = cfg.seq_len, DEFAULTS["model"]["max_seq_len"]
        source = ("train", "seq_len") if t.seq_len else ("model", "max_seq_len")
        length = (*source, seq_len, usual)
    sizes = {"length": length, **{name: ("train", name, getattr(t, name), DEFAULTS["train"][name])
                                  for name in ("batch_size", "grad_accum")}}
    if t.global_batch is not None:  # the micro-steps follow from it: it is what was given
        sizes["grad_accum"] = ("train", "global_batch", t.global_batch, t.batch_size)
    key = sizes[largest_departure({name: size[2:] for name, size in sizes.items()})][:3]
    check_forward_fits(cfg.model, t.batch_size, seq_len, device, key, training=True,
                       extra=2 * TOKEN_BYTES * t.grad_accum * t.batch_size * seq_len)
    check_fits(2 * TOKEN_BYTES * t.eval_steps * t.batch_size * seq_len, device,
               f"{t.eval_steps:,} validation batches of {t.batch_size:,} x {seq_len:,} tokens",
               key=("train", "eval_steps", t.eval_steps))


class LossModule(nn.Module):
    """model.loss as a forward(): a batch (x, y) or (x, y, positions), each [B, T]."""

    def __init__(self, model: GPT) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor | None = None,
                ) -> torch.Tensor:
        return self.model.loss(x, y, positions)


def wrap_for_training(model: GPT, *, ddp: bool, compile: bool, device: torch.device) -> nn.Module:
    net: nn.Module = LossModule(model)
    if ddp:
        net = nn.parallel.DistributedDataParallel(
            net, device_ids=[device.index] if device.type == "cuda" else None)
    if compile:
        use_compile_cache()
        use_deterministic_compilation()
        net = torch.compile(net)
    return net


def optimizer_step(net: nn.Module, model: GPT, optimizer: torch.optim.Optimizer,
                   micro_batches: Sequence[tuple[torch.Tensor, ...]], *, grad_clip: float,
                   autocast: Callable[[], Any], ddp: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One update over ``micro_batches`` ((x, y) or (x, y, positions) [B, T] each): (sum of their
    float32 losses, grad norm)."""
    loss_sum = torch.zeros((), device=micro_batches[0][0].device)
    last = len(micro_batches) - 1
    for i, batch in enumerate(micro_batches):
        sync = net.no_sync() if ddp and i < last else contextlib.nullcontext()
        with sync:
            with autocast():
                loss = net(*batch)
            (loss / len(micro_batches)).backward()
        loss_sum += loss.detach().float()
    # The norm is computed (and checked by the caller) even without clipping: max_norm=inf scales by 1.
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip if grad_clip > 0 else math.inf)
    optimizer.step()
    project_parameters(model)
    optimizer.zero_grad(set_to_none=True)
    return loss_sum, grad_norm


def project_parameters(model: nn.Module) -> None:
    """Each positional encoding in ``model`` puts its stored parameters back in range after an update.

    A walk over the modules rather than a GPT method: a layout's encodings are reached as
    submodules, and the bench steps models that are not GPTs (which hold no encoding)."""
    for module in model.modules():
        if isinstance(module, PositionalEncoding):
            module.project_parameters()
