"""What a model of a config needs in memory, known before anything is allocated.

Every entry point asks these before it builds a model or a batch, and refuses with
``nanoattn.runtime.check_fits`` (one line naming the option) when the device cannot hold it:

- ``meta_model``: the weights. A lower bound from the config alone first (``weights_at_least``),
  so a config of 10**8 layers is refused without building one block; then the model on the
  meta device (shapes, no memory) and its exact parameter count. Checkpoints and transformers
  folders compare their weights' headers with this meta model before reading a tensor.
- ``activation_bytes``: a lower bound on a forward pass over ``tokens`` (batch x length): the
  residual stream and the MLP's hidden layer of one layer at once, in the narrowest dtype a
  pass computes in (bfloat16 under autocast); with autograd every layer's are kept. The real
  peak is higher (attention, logits, allocator slack): a size refused here cannot fit.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.init
from torch.overrides import TorchFunctionMode

from nanoattn.config import ModelConfig
from nanoattn.model.gpt import GPT
from nanoattn.runtime import check_fits, fits
from nanoattn.validation import declared_defaults, is_int, largest_departure

# torch.nn.init's in-place initializers (normal_, kaiming_uniform_, ...): torch dispatches them to a
# function mode, as torch.device("meta") does.
INITIALIZERS = frozenset(getattr(torch.nn.init, name) for name in dir(torch.nn.init)
                         if name.endswith("_") and not name.startswith("_"))


class _SkipInitializers(TorchFunctionMode):
    """Every ``torch.nn.init`` initializer returns its tensor untouched: a meta tensor has no values,
    and torch fills one through its reference implementations, whose first call imports
    torch._dynamo, seconds of a script's start."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in INITIALIZERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Modules built inside have their shapes on the meta device, neither memory nor values."""
    with torch.device("meta"), _SkipInitializers():
        yield


WEIGHT_BYTES = 4  # weights are float32 (autocast computes in bf16, it stores nothing narrower)
ACTIVATION_BYTES = 2  # the narrowest element a forward pass computes in (bfloat16 autocast)
DEFAULTS = declared_defaults(ModelConfig)


def weights_at_least(cfg: ModelConfig) -> int:
    """A lower bound on the parameters of ``GPT(cfg)`` from the config alone: the token table and,
    in every layer, an output projection (d_model x d_model) and an MLP of at least two
    d_model x ffn_dim matrices, whatever the attention variant and the encoding."""
    per_layer = cfg.d_model * cfg.d_model + 2 * cfg.d_model * cfg.ffn_dim
    return cfg.vocab_size * cfg.d_model + cfg.n_layer * per_layer


def meta_model(cfg: ModelConfig, device: torch.device | str = "cpu", *, owner: str = "model") -> GPT:
    """``GPT(cfg)`` on the meta device, once its weights are known to fit ``device``'s memory.

    Refused in one line naming the field (``<owner>.n_layer=... is invalid: ...``) by the lower
    bound before any block is built, then by the exact count.
    """
    device = torch.device(device)
    shape = ", ".join(f"{n}={getattr(cfg, n):,}" for n in ("n_layer", "d_model", "vocab_size"))
    if not fits(WEIGHT_BYTES * weights_at_least(cfg), device):
        name = largest_contributor(cfg, weights_at_least)
        check_fits(WEIGHT_BYTES * weights_at_least(cfg), device, f"a model of {shape}", at_least=True,
                   key=(owner, name, getattr(cfg, name)))
    with on_meta():
        model = GPT(cfg)
    count = model.num_params()
    if not fits(WEIGHT_BYTES * count, device):
        name = largest_contributor(cfg, parameter_count)
        check_fits(WEIGHT_BYTES * count, device, f"a model of {shape} ({count:,} parameters)",
                   key=(owner, name, getattr(cfg, name)))
    return model


def parameter_count(cfg: ModelConfig) -> int:
    with on_meta():
        return GPT(cfg).num_params()


def largest_contributor(cfg: ModelConfig, size: Callable[[ModelConfig], int]) -> str:
    """The integer field a refusal of ``size(cfg)`` names: of the fields whose value changes the size
    (set to its default, halved or doubled, where that is a valid config), the one furthest above its
    default by ratio (a canon width or an Abacus offset, not the layers)."""
    total, sizing = size(cfg), {}
    for field in dataclasses.fields(cfg):
        value, default = getattr(cfg, field.name), DEFAULTS.get(field.name)
        if not is_int(value) or value == default:
            continue
        for other in (default, value // 2, 2 * value):
            try:
                changed = size(dataclasses.replace(cfg, **{field.name: other})) != total
            except ValueError:  # not a valid config beside the other fields
                continue
            if changed:
                sizing[field.name] = (value, default or 1)
                break
    return largest_departure(sizing) if sizing else "n_layer"


def activation_bytes(cfg: ModelConfig, tokens: int, *, training: bool = False) -> int:
    """A lower bound on the activations of a forward pass over ``tokens`` (see the module docstring)."""
    per_token = ACTIVATION_BYTES * (cfg.d_model + cfg.ffn_dim)
    return tokens * per_token * (cfg.n_layer if training else 1)


def check_forward_fits(cfg: ModelConfig, batch_size: int, seq_len: int, device: torch.device,
                       key: tuple[str, str, Any], *, training: bool = False, extra: int = 0) -> None:
    """Refuse a forward pass (with ``training``, a training step: the weights, their gradients and
    every layer's activations) over ``batch_size`` x ``seq_len`` tokens that cannot fit ``device``;
    ``extra`` bytes (the batch itself, kept results) count too."""
    need = activation_bytes(cfg, batch_size * seq_len, training=training) + extra
    if training:
        need += 2 * WEIGHT_BYTES * weights_at_least(cfg)
    what = f"{'a training step' if training else 'a forward pass'} over {batch_size:,} x {seq_len:,} tokens"
    check_fits(need, device, what, key=key, at_least=True)
