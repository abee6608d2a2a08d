"""Context extension: fine-tune a RoPE checkpoint at a longer length under a RoPE scaling.

The recipe of Position Interpolation (Chen et al. 2023) and YaRN (Peng et al. 2023): the
checkpoint's weights, a scaling whose original length is the one the checkpoint was trained at,
then a few hundred steps at a small learning rate on the same data at the longer length. It is
``train`` with ``train.init_from``; this module adds only the checks that make such a run an
extension, all before anything is written:

- The model comes from the checkpoint. ``model`` may set only ``rope_scaling`` (required) and
  ``max_seq_len`` (default ``train.seq_len``), so a fine-tune cannot silently change the
  checkpoint's ``rope_theta`` or shape.
- The checkpoint rotates (``ModelConfig.rotary``: RoPE or xPos, alone or in a per-layer layout
  such as iRoPE), and the scaling is not ``dynamic``: dynamic NTK's frequencies are a
  function of the input length, so training at L would fit the base of length L only, while
  inference at any other length uses another base. It is a zero-shot method, applied at load time.
- ``original_max_seq_len`` defaults to the length the checkpoint's *unscaled* frequencies were
  trained at: its ``train_seq_len``, or, for a checkpoint extended before, its own scaling's
  original length. Scalings replace each other and never stack, so extending 128 -> 512 -> 2048
  is factor 4, then factor 16 over the same 128.
- ``train.seq_len`` is longer than the checkpoint's training length.
- The checkpoint is ``ckpt``, the key every command that starts from a checkpoint takes; train.py's
  ``train.init_from`` names it too (one of the two, or both alike).

The run directory is an ordinary one; its checkpoints carry the scaling in ``config.json`` and
``train_seq_len`` = the new length, so ``load_checkpoint`` and the scripts use it as trained.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nanoattn.checkpoint import read_checkpoint_config, trained_length, with_original_length
from nanoattn.config import ModelConfig, RunConfig
from nanoattn.positional import encodings_with
from nanoattn.positional.rope_scaling_params import SCALING_TYPES
from nanoattn.train.loop import train
from nanoattn.train.run_dir import resolve_init_from

# The model fields an extension sets; everything else is the checkpoint's.
EXTENSION_FIELDS = ("rope_scaling", "max_seq_len")
# Every scaling but dynamic NTK, whose base follows the input length (see the module docstring).
FINE_TUNE_TYPES = " | ".join(kind for kind in SCALING_TYPES if kind != "dynamic")


def extension_config(cfg: Mapping[str, Any]) -> RunConfig:
    """Validate a context extension (a RunConfig as a mapping) and return the run it trains."""
    values = copy.deepcopy(dict(cfg))
    train_values = dict(values.get("train") or {})
    ckpt, source = values.pop("ckpt", None), train_values.get("init_from")
    if ckpt is not None and source is not None and str(ckpt) != str(source):
        raise ValueError(f"ckpt={ckpt!r} and train.init_from={source!r} name two checkpoints: give one")
    source = ckpt or source
    if not source:
        raise ValueError("ckpt is missing: set it to the checkpoint or run directory to extend "
                         "(ckpt=runs/...)")
    values["train"] = train_values = {**train_values, "init_from": str(source)}
    meta = read_checkpoint_config(source)
    trained = ModelConfig.from_dict(meta.get("model") or {})
    if not trained.rotary:
        raise ValueError(f"train.init_from={source!r} has pos={trained.pos!r}: context extension by RoPE "
                         f"scaling needs a RoPE checkpoint (a rotary encoding in some layer: "
                         f"{' | '.join(encodings_with('rotary'))})")
    trained_len = trained_length(meta)

    model = dict(values.get("model") or {})
    other = sorted(set(model) - set(EXTENSION_FIELDS))
    if other:
        raise ValueError(f"model.{other[0]} cannot be set when extending a context: the model is "
                         f"{source}'s; only model.rope_scaling and model.max_seq_len may be given")
    scaling = model.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        raise ValueError(f"model.rope_scaling={scaling!r} is invalid: extending a context needs a scaling "
                         f"such as {{type: yarn, factor: 4}}; types: {FINE_TUNE_TYPES}")
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind == "dynamic":
        raise ValueError("model.rope_scaling.type='dynamic' is invalid for fine-tuning: its base depends on "
                         "the input length, so it is applied zero-shot at inference (rope_scaling="
                         "{type: dynamic, factor: 4} in eval_length or sample, or load_checkpoint's "
                         f"rope_scaling); fine-tune with {FINE_TUNE_TYPES}")
    scaling = with_original_length(scaling, meta)

    seq_len = train_values.get("seq_len")
    if seq_len is None:
        raise ValueError("train.seq_len is missing: set the length to fine-tune at, "
                         f"longer than the {trained_len} tokens {source} was trained at")
    model["rope_scaling"] = scaling
    model.setdefault("max_seq_len", seq_len)
    run = resolve_init_from({**values, "model": model})
    if run.seq_len <= trained_len:
        raise ValueError(f"train.seq_len={run.seq_len} is invalid: an extension must be longer than the "
                         f"{trained_len} tokens {source} was trained at")
    return run


def extend_context(cfg: Mapping[str, Any]) -> Path:
    """Fine-tune ``ckpt`` (or ``train.init_from``, the same key as train.py's) at ``train.seq_len`` under
    ``model.rope_scaling``; the run directory."""
    return train(extension_config(cfg))
