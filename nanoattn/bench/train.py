"""``train``: training-step tokens/s, nanoattn vs transformers and a bare reference; ``mfu``: over the peak.

- The same work: the transformers model has nanoattn's weights (``twin.py``). Its loss gets
  ``shift_labels`` = our targets, so both predict B x T tokens from the same B x T inputs
  (``labels`` alone shifts them and predicts T - 1 per row). Their losses on the initial weights
  (``initial_loss``) show that they compute the same function. The bare reference (``bare.py``:
  the same block as plainly as PyTorch allows, GPT's weights loaded) is the floor nanoattn's
  machinery is measured against (``vs_bare``); the machine's is ``mfu``.
- The same step: all three go through ``nanoattn.train.step.optimizer_step``, the update the
  training loop runs (forward under autocast, backward, global-norm clipping, the optimizer), with
  the optimizer ``nanoattn.train.optim.optimizer_for`` builds for the ``train_recipe``'s run (by default
  the default run's: Muon for every linear layer's matrix but the head, AdamW for the rest, an
  untied head, token shift, which transformers' Llama gets as a hook: ``training_twin``).
  transformers' Llama keeps q, k, v and the MLP's gate and up as separate matrices,
  so Muon orthogonalises seven matrices a layer there against four in nanoattn and the bare block:
  the same FLOPs forward and backward, more small ones in the optimizer. nanoattn's loss module is
  ``wrap_for_training``'s, as in training; transformers' is ``TwinLoss``; each is compiled the
  same way with ``compile=true``.
- Tokens per second counts input tokens per optimizer step, wall time.
- MFU is ``GPT.flops_per_token`` (6 x matmul weights + the full T x T attention, PaLM's count)
  times tokens/s over the machine's matmul peak, measured in the same run as the fastest of
  ``reps`` 2048^3 matmuls in that dtype (not a datasheet's number).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping

import torch
from torch import nn

from nanoattn.bench.bare import BareGPT
from nanoattn.bench.core import TRAIN_DTYPES, BenchConfig, Row, alternate, random_tokens, section, shape_text
from nanoattn.bench.speedrun import recipe
from nanoattn.bench.twin import transformers_twin
from nanoattn.config import TrainConfig
from nanoattn.model import GPT
from nanoattn.model.gpt import shift_tokens
from nanoattn.runtime import autocast, autocast_dtype, synchronize
from nanoattn.train.optim import optimizer_for
from nanoattn.train.step import optimizer_step, wrap_for_training

PEAK_MATMUL = 2048  # n of the n x n x n matmul whose rate is the peak (quick: half, 8x less work)


class TwinLoss(nn.Module):
    """A transformers causal LM's loss as ``forward(x, y)``, like ``nanoattn.train.step.LossModule``."""

    def __init__(self, twin: nn.Module) -> None:
        super().__init__()
        self.twin = twin

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.twin(input_ids=x, labels=y, shift_labels=y).loss


def _stepper(net: nn.Module, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor], t: TrainConfig,
             device: torch.device) -> Callable[[str], None]:
    """One optimizer update of ``model`` through ``net`` on ``batch``, under a dtype given per call."""
    optimizer = optimizer_for(model, t, device)

    def step(dtype: str) -> None:
        amp, _ = autocast_dtype(dtype, device)
        # optimizer_step reads only model.parameters(), so transformers' model fits it as well as a GPT.
        optimizer_step(net, model, optimizer, [batch], grad_clip=t.grad_clip,
                       autocast=lambda: autocast(device, amp))
    return step


def training_twin(model: GPT, device: torch.device) -> nn.Module:
    """transformers' model with ``model``'s weights. Token shift, which no transformers class has, is
    a hook on its token embeddings: right for whole sequences (a training step), not cached decoding."""
    if not model.cfg.token_shift:
        return transformers_twin(model, device)
    plain = GPT(dataclasses.replace(model.cfg, token_shift=False))
    plain.load_state_dict({name: p for name, p in model.state_dict().items() if name != "shift_gate"})
    twin = transformers_twin(plain, device)
    twin.shift_gate = nn.Parameter(model.shift_gate.detach().clone().to(device))
    embeddings = twin.get_input_embeddings()
    embeddings.register_forward_hook(lambda module, inputs, e: shift_tokens(e, twin.shift_gate))
    return twin


def train_rows(cfg: BenchConfig) -> list[Row]:
    device = cfg.torch_device()
    run = recipe(cfg.train_recipe, base_model=cfg.model)
    torch.manual_seed(0)
    with device:
        ours = GPT(run.model).train()
    theirs = training_twin(ours, device).train()
    bare = BareGPT(run.model).to(device).train()
    bare.load_state_dict(ours.state_dict())
    B, T = cfg.batch_size, cfg.seq_len
    x = random_tokens(run.model.vocab_size, (B, T), device, seed=1)  # [B, T]
    y = random_tokens(run.model.vocab_size, (B, T), device, seed=2)  # [B, T]
    with torch.no_grad():  # the same weights, so the same loss: they compute the same function
        initial = {"nanoattn": ours.loss(x, y).item(), "transformers": TwinLoss(theirs)(x, y).item(),
                   "bare": bare(x, y).item()}
    steppers = {}
    for compiled in (False, True) if cfg.compile else (False,):
        twin_loss = TwinLoss(theirs)
        nets = {"nanoattn": (wrap_for_training(ours, ddp=False, compile=compiled, device=device), ours),
                "transformers": (torch.compile(twin_loss) if compiled else twin_loss, theirs),
                "bare": (torch.compile(bare) if compiled else bare, bare)}
        for impl, (net, model) in nets.items():
            steppers[impl, compiled] = _stepper(net, model, (x, y), run.train, device)
    flops = ours.flops_per_token(T)
    rows = []
    for dtype in TRAIN_DTYPES:
        timed = {key: (lambda step=step, dtype=dtype: step(dtype)) for key, step in steppers.items()}
        seconds = alternate(timed, cfg.reps, device, warmup=2 if cfg.compile else 1)
        baseline, bare_rate = (B * T / seconds[impl, False] for impl in ("transformers", "bare"))
        for (impl, compiled), s in seconds.items():
            rate = B * T / s
            rows.append(dict(impl=impl + (" + compile" if compiled else ""), dtype=dtype,
                             shape=shape_text(run.model, B, T), optimizer=run.train.optimizer,
                             initial_loss=initial[impl], step_ms=1000 * s,
                             tok_per_s=rate, vs_transformers=rate / baseline, vs_bare=rate / bare_rate,
                             flops_per_token=flops))
    return rows


@section("train")
def train_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Training-step tokens/s, nanoattn vs transformers' Llama and the bare block, fp32 and bf16."""
    return train_rows(cfg)


def matmul_peak(dtype: str, device: torch.device, reps: int, n: int = PEAK_MATMUL) -> float:
    """FLOP/s of an n x n x n matmul in ``dtype``: the fastest of ``reps`` runs after a warm-up.

    The fastest, not the median: a peak is what the machine can do, and other processes only
    ever slow a run down.
    """
    a, b = (torch.randn(n, n, device=device, dtype=getattr(torch, dtype),
                        generator=torch.Generator(device).manual_seed(i)) for i in (0, 1))
    seconds = []
    for run in range(reps + 1):
        start = time.perf_counter()
        a @ b
        synchronize(device)
        if run:
            seconds.append(time.perf_counter() - start)
    return 2 * n**3 / min(seconds)


@section("mfu")
def mfu_section(cfg: BenchConfig, done: Mapping[str, list[Row]]) -> list[Row]:
    """Model FLOPs utilisation of every train row against the measured matmul peak of its dtype."""
    device = cfg.torch_device()
    rows_of_train = done.get("train") or train_rows(cfg)
    n = PEAK_MATMUL // 2 if cfg.quick else PEAK_MATMUL
    peaks = {dtype: matmul_peak(dtype, device, cfg.reps, n) for dtype in TRAIN_DTYPES}
    rows = [dict(impl=f"matmul {n}^3", dtype=dtype, gflop_per_s=peak / 1e9) for dtype, peak in peaks.items()]
    for row in rows_of_train:
        achieved = row["flops_per_token"] * row["tok_per_s"]
        rows.append(dict(impl=row["impl"], dtype=row["dtype"], gflop_per_s=achieved / 1e9,
                         mfu=achieved / peaks[row["dtype"]]))
    return rows
