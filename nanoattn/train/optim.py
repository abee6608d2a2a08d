"""The optimizer (AdamW, or Muon for the blocks' matrices with AdamW for the rest), its parameter
groups and learning-rate schedules.

Design choices:
- Weight decay applies to matmul weights only. Norm gains, biases and embeddings (token and
  learned-position tables) are not decayed unless ``decay_embeddings`` asks for the embeddings:
  decaying a gain pulls it towards 0, not towards "no effect", and an embedding row is only
  updated when its token occurs, so decay would shrink rare tokens most. A tied LM head is the
  token embedding and follows it.
- Groups are found by shape and module type, not by parameter name, so a new layer needs no new
  naming rule: 1-D parameters are norm gains and biases, ``nn.Embedding`` weights are embeddings.
- Schedules are pure functions of the step (``lr_at``): a resumed run recomputes the exact
  learning rate from the step alone, and nothing but the step needs saving for them.
- ``fused=True`` AdamW where the device has the kernel (CUDA, and CPU since torch 2.4): one kernel
  for all parameters instead of a loop of small ops.
- ``optimizer="muon"``: ``torch.optim.Muon``'s update (Jordan et al. 2024) for the 2-D weights of the
  transformer blocks (attention and MLP matrices), AdamW as above for everything else (embeddings,
  the LM head, norms, biases, positional and scalar parameters). Muon's update is scaled to
  AdamW's RMS (``adjust_lr_fn="match_rms_adamw"``, Liu et al. 2025, Moonlight), so one schedule
  and peak ``lr`` drive both; ``muon_lr_scale`` multiplies Muon's. Each param group carries its
  ``lr_scale``: the loop sets ``lr = lr_at(step) * lr_scale``. ``StackedMuon`` computes it with the
  matrices of each shape stacked: one batched Newton-Schulz product per iteration and shape.
- ``embedding_lr_scale`` and ``head_lr_scale`` set the embedding tables' and an untied head's
  rates apart, as modded-nanogpt tunes them (``scaled_groups``); a tied head is the token table.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from nanoattn.config import TrainConfig


def param_groups(model: nn.Module, weight_decay: float, *, decay_embeddings: bool = False) -> list[dict]:
    """Two AdamW groups: {"params": decayed, "weight_decay": weight_decay} and {..., 0.0}.

    Every parameter appears exactly once (tied weights included).
    """
    no_decay: set[int] = set()
    for module in model.modules():
        for p in module.parameters(recurse=False):
            if p.ndim < 2 or (isinstance(module, nn.Embedding) and not decay_embeddings):
                no_decay.add(id(p))
    decay, keep = [], []
    for p in model.parameters():  # deduplicated: a tied head is listed once, as the embedding
        if p.requires_grad:
            (keep if id(p) in no_decay else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": keep, "weight_decay": 0.0}]


def scaled_groups(model: nn.Module, groups: list[dict], *, embedding_lr_scale: float = 1.0,
                  head_lr_scale: float = 1.0) -> list[dict]:
    """``groups`` each split by learning-rate scale, every group with its ``lr_scale``: the weights of
    ``nn.Embedding`` tables at ``embedding_lr_scale``, the model's ``lm_head``, unless it is tied to
    a table, at ``head_lr_scale``, everything else at 1. With both scales at 1 the groups stay as
    they are. Any model with these modules works (the bench steps transformers' Llama too)."""
    scale = {id(m.weight): embedding_lr_scale for m in model.modules() if isinstance(m, nn.Embedding)}
    head = getattr(model, "lm_head", None)
    if head is not None and id(head.weight) not in scale:
        scale[id(head.weight)] = head_lr_scale
    split = []
    for group in groups:
        by_scale: dict[float, list[nn.Parameter]] = {}
        for p in group["params"]:
            by_scale.setdefault(scale.get(id(p), 1.0), []).append(p)
        split += [{**group, "params": params, "lr_scale": lr_scale} for lr_scale, params in by_scale.items()]
    return split


def muon_params(model: nn.Module) -> list[nn.Parameter]:
    """The parameters Muon updates: the weights of every linear layer but the model's ``lm_head``.

    In a GPT these are the blocks' attention and MLP matrices; found by module type, the same rule
    finds them in transformers' Llama and the bench's bare reference, which the bench steps alike.
    """
    head = getattr(model, "lm_head", None)
    return [module.weight for module in model.modules()
            if isinstance(module, nn.Linear) and module is not head]


def newton_schulz(updates: torch.Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float) -> torch.Tensor:
    """torch.optim.Muon's orthogonalisation of each matrix of ``updates`` [n, rows, cols], in bf16:
    each scaled to Frobenius norm 1, then ``steps`` of X <- aX + (bA + cA^2)X with A = XX^T, wide side
    out. One batched product per iteration for the n matrices, where torch runs one per matrix."""
    a, b, c = coefficients
    x = updates.bfloat16()
    tall = x.shape[-2] > x.shape[-1]
    if tall:
        x = x.mT
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.baddbmm(x, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def muon_rate_ratio(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's factor on the rate of a matrix of ``shape`` [A, B], by its adjust_lr_fn."""
    rows, cols = shape[:2]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return math.sqrt(max(1, rows / cols))
    return 0.2 * math.sqrt(max(rows, cols)) if adjust_lr_fn == "match_rms_adamw" else 1.0


class StackedMuon(torch.optim.Muon):
    """torch.optim.Muon with the matrices of one shape orthogonalised together (``newton_schulz``):
    a model's layers share their shapes, so an update runs a few batched products per iteration
    instead of one per matrix. The update is torch's (a test), and so are the param groups and the
    state, so a checkpoint of either loads in the other."""

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            by_shape: dict[torch.Size, list[torch.Tensor]] = {}
            for param in group["params"]:
                if param.grad is not None:
                    by_shape.setdefault(param.shape, []).append(param)
            lr, momentum = group["lr"], group["momentum"]
            for shape, params in by_shape.items():
                updates = []
                for param in params:
                    grad, state = param.grad, self.state[param]
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(grad)
                    buffer = state["momentum_buffer"]
                    buffer.lerp_(grad, 1 - momentum)
                    updates.append(grad.lerp(buffer, momentum) if group["nesterov"] else buffer)
                orthogonal = newton_schulz(torch.stack(updates), group["ns_coefficients"], group["ns_steps"],
                                           group["eps"])
                rate = lr * muon_rate_ratio(group["adjust_lr_fn"], shape)
                for param, update in zip(params, orthogonal, strict=True):
                    param.mul_(1 - lr * group["weight_decay"])
                    param.add_(update, alpha=-rate)
        return loss


class OptimizerPair:
    """Muon and AdamW stepped together, checkpointed as one state dict; ``param_groups`` lists both."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.optimizers = (muon, adamw)

    @property
    def param_groups(self) -> list[dict]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"muon": self.optimizers[0].state_dict(), "adamw": self.optimizers[1].state_dict()}

    def load_state_dict(self, state: dict) -> None:
        if set(state) != {"muon", "adamw"}:
            raise ValueError(f"the checkpoint's optimizer state has {sorted(state)}; train.optimizer=muon "
                             f"needs its muon and adamw states (was the run trained with another optimizer?)")
        self.optimizers[0].load_state_dict(state["muon"])
        self.optimizers[1].load_state_dict(state["adamw"])


def optimizer_for(model: nn.Module, t: TrainConfig,
                  device: torch.device) -> torch.optim.AdamW | OptimizerPair:
    """``make_optimizer`` with every setting of a run's ``TrainConfig``, as training and the bench use it."""
    return make_optimizer(model, lr=t.lr, weight_decay=t.weight_decay, betas=(t.beta1, t.beta2),
                          decay_embeddings=t.decay_embeddings, device=device, optimizer=t.optimizer,
                          muon_lr_scale=t.muon_lr_scale, muon_weight_decay=t.muon_weight_decay,
                          muon_momentum=t.muon_momentum, embedding_lr_scale=t.embedding_lr_scale,
                          head_lr_scale=t.head_lr_scale)


def make_optimizer(model: nn.Module, *, lr: float, weight_decay: float, betas: tuple[float, float],
                   decay_embeddings: bool, device: torch.device, optimizer: str = "adamw",
                   muon_lr_scale: float = 1.0, muon_weight_decay: float | None = None,
                   muon_momentum: float = 0.95, embedding_lr_scale: float = 1.0,
                   head_lr_scale: float = 1.0) -> torch.optim.AdamW | OptimizerPair:
    """AdamW over ``param_groups`` split by ``scaled_groups``, or (``optimizer="muon"``) Muon for
    ``muon_params`` (its weight decay ``muon_weight_decay``, None: ``weight_decay``; its
    ``lr_scale`` ``muon_lr_scale``) with AdamW for the rest."""
    fused = device.type in ("cuda", "cpu")
    groups = scaled_groups(model, param_groups(model, weight_decay, decay_embeddings=decay_embeddings),
                           embedding_lr_scale=embedding_lr_scale, head_lr_scale=head_lr_scale)
    if optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=fused)
    matrices = muon_params(model)
    hidden = {id(p) for p in matrices}
    rest = [{**g, "params": [p for p in g["params"] if id(p) not in hidden]} for g in groups]
    muon_decay = weight_decay if muon_weight_decay is None else muon_weight_decay
    muon = StackedMuon([{"params": matrices, "lr_scale": muon_lr_scale}], lr=lr * muon_lr_scale,
                       weight_decay=muon_decay, momentum=muon_momentum, adjust_lr_fn="match_rms_adamw")
    adamw = torch.optim.AdamW([g for g in rest if g["params"]], lr=lr, betas=betas, fused=fused)
    return OptimizerPair(muon, adamw)


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, max_steps: int, schedule: str,
          decay_fraction: float = 0.2, decay_steps: int | None = None) -> float:
    """The learning rate of optimizer update ``step`` (0-based, < max_steps).

    - warmup: linear, lr * (step + 1) / warmup_steps for the first ``warmup_steps`` updates;
    - cosine: then half a cosine from lr down to min_lr at the last update, or with ``decay_steps``
      at update decay_steps - 1 and min_lr from there on (nanoGPT's ``lr_decay_iters``): a rate
      that does not depend on max_steps, so a run stopped early follows it whatever its budget;
    - wsd: then lr held constant until the last ``decay_fraction * max_steps`` updates, which
      decay to min_lr with the "1 - sqrt" shape (Hägele et al. 2024, arXiv:2405.18392, found it
      better than a linear cooldown; 20% of training matches cosine);
    - constant: then lr.
    """
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "cosine":
        span = max(1, (max_steps if decay_steps is None else decay_steps) - 1 - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (lr - min_lr)
    if schedule == "wsd":
        decay_steps = max(1, round(decay_fraction * max_steps))
        decay_start = max(warmup_steps, max_steps - decay_steps)
        if step < decay_start:
            return lr
        progress = min(1.0, (step - decay_start + 1) / (max_steps - decay_start))
        return min_lr + (1 - math.sqrt(progress)) * (lr - min_lr)
    raise ValueError(f"train.schedule={schedule!r} is invalid: allowed: cosine | wsd | constant")
