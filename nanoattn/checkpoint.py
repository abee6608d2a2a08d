"""Crash-safe checkpoints that never execute code on load.

A checkpoint is a directory:
    model.safetensors   weights (tied weights stored once)
    config.json         {"model": ModelConfig fields, "train_seq_len": int, "step": int, "version": str},
                        and what was measured on these weights when it was written (a task run's
                        "exact_1x", which tells a run stopped at its accuracy from one cut short)
    tokenizer.json      the HF tokenizers file the model was trained with
    trainer_state.pt    optional: optimizer, schedule, step, RNG, data position (tensors and plain
                        containers only; loaded with weights_only=True)
It is written to a temporary sibling directory and renamed into place, then
``checkpoints/latest`` (a text file naming the newest complete checkpoint) is replaced
atomically. A kill at any instant leaves the previous checkpoint and ``latest`` intact; the
leftover temporary directory (a dot-name) is ignored by every reader and removed by
``remove_stale_temps`` when a run starts again. Old checkpoints are pruned only after the new
one is complete and ``latest`` names it.

The length rules live here, once:
- ``trained_length(meta)``: the length a checkpoint was trained at (its ``train_seq_len``, else
  its model's ``max_seq_len``).
- ``original_length(meta)``: the length its *unscaled* RoPE frequencies were fitted to, the
  default ``original_max_seq_len`` of any scaling applied to it (zero-shot, ``init_from`` or a
  context extension): a scaled checkpoint's own original length, else its training length.
  Scalings replace each other and never stack.
``init_model_config`` decides the model of a run started from a checkpoint's weights
(``train.init_from``): the checkpoint's shape, with the few fields in ``INIT_OVERRIDABLE`` taken
from the run's config (context extension changes the context length and the RoPE scaling).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from pickle import UnpicklingError  # only the error torch.load(weights_only=True) raises on a refusal
from typing import Any, NamedTuple

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, safe_open, save_file
from tokenizers import Tokenizer

from nanoattn.config import ModelConfig
from nanoattn.model import GPT, meta_model
from nanoattn.positional import encodings_with
from nanoattn.runtime import CHECKPOINTS, temporary_sibling, write_atomic
from nanoattn.validation import is_int

LATEST = "latest"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")  # a checkpoint's name: no separators
FORMAT_VERSION = "1"
# Model fields a run started with train.init_from takes from its own config; every other field
# comes from the checkpoint, since the weights fix the shape.
INIT_OVERRIDABLE = ("max_seq_len", "rope_scaling", "rope_theta", "dropout", "attn_kernel")
ORIGINAL_KEYS = ("original_max_seq_len", "original_max_position_embeddings")  # ours, transformers'


class CheckpointError(ValueError):
    """A missing, incomplete or corrupt checkpoint (one line, names the path)."""


class Checkpoint(NamedTuple):
    model: GPT
    tokenizer: Any  # tokenizers.Tokenizer, or None when the checkpoint has no tokenizer.json
    config: ModelConfig
    path: Path
    train_seq_len: int
    step: int



def save_checkpoint(
    ckpt_root: str | Path,
    name: str,
    model: GPT,
    *,
    train_seq_len: int,
    step: int,
    tokenizer_file: str | Path | None = None,
    trainer_state: Mapping[str, Any] | None = None,
    keep_last: int | None = None,
    measured: Mapping[str, float] | None = None,
) -> Path:
    """Write ``ckpt_root/name`` atomically, point ``latest`` at it, then prune old ones.

    ``measured``: values measured on exactly these weights, kept in config.json beside the step.

    A failure (a full disk, a read-only folder) removes the partial copy, leaves the previous
    checkpoint and ``latest`` as they were, and raises an OSError naming the checkpoint.
    """
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / name
    tmp = temporary_sibling(final)
    try:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_files(tmp, model, train_seq_len=train_seq_len, step=step, tokenizer_file=tokenizer_file,
                     trainer_state=trainer_state, measured=measured or {})
        if final.exists():  # re-saving the same step: move the old copy aside, never delete it first
            old = temporary_sibling(final, "old")
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
        else:
            os.replace(tmp, final)
        write_atomic(ckpt_root / LATEST, name + "\n")
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(f"could not save checkpoint {final} ({e.strerror or e}); the previous checkpoint "
                      "is intact") from None
    if keep_last is not None:
        prune_checkpoints(ckpt_root, keep_last)
    return final


def _write_files(tmp: Path, model: GPT, *, train_seq_len: int, step: int, tokenizer_file: str | Path | None,
                 trainer_state: Mapping[str, Any] | None, measured: Mapping[str, float]) -> None:
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        state.pop("lm_head.weight")
    save_file(state, tmp / "model.safetensors")
    meta = {"model": model.cfg.to_dict(), "train_seq_len": train_seq_len, "step": step,
            "version": FORMAT_VERSION, **measured}
    (tmp / "config.json").write_text(json.dumps(meta, indent=2) + "\n")
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, tmp / "tokenizer.json")
    if trainer_state is not None:
        torch.save(dict(trainer_state), tmp / "trainer_state.pt")
    for file in tmp.iterdir():
        with open(file, "rb") as f:
            os.fsync(f.fileno())


def _step_of(path: Path) -> int | None:
    try:
        return int(json.loads((path / "config.json").read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def list_checkpoints(ckpt_root: Path) -> list[Path]:
    """Complete checkpoints (a readable config.json with a step), oldest first by step.

    Only real directories count: a symlink inside ``checkpoints/`` is never read nor pruned.
    """
    if not ckpt_root.is_dir():
        return []
    dirs = [p for p in ckpt_root.iterdir() if p.is_dir() and not (p.is_symlink() or p.name.startswith("."))]
    found = [p for p in dirs if (p / "model.safetensors").exists() and _step_of(p) is not None]
    return sorted(found, key=_step_of)


def remove_stale_temps(ckpt_root: Path) -> None:
    """Delete the temporary directories and files of saves that were killed mid-way."""
    for p in ckpt_root.glob(".*.tmp*") if ckpt_root.is_dir() else []:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def prune_checkpoints(ckpt_root: Path, keep_last: int) -> None:
    """Delete all but the newest ``keep_last`` checkpoints (never the one ``latest`` names)."""
    latest = latest_checkpoint(ckpt_root)
    for old in list_checkpoints(ckpt_root)[:-keep_last] if keep_last > 0 else []:
        if old != latest:
            shutil.rmtree(old)


def latest_checkpoint(ckpt_root: Path) -> Path:
    """The checkpoint ``ckpt_root/latest`` names, confined to ``ckpt_root``.

    ``latest`` must be a plain file holding the name of a real (not symlinked) checkpoint
    directory directly inside ``ckpt_root``; anything else is refused without echoing the
    file's content, so a planted symlink can neither redirect a run nor leak a file.
    """
    pointer = ckpt_root / LATEST
    if pointer.is_symlink() or not pointer.is_file():
        raise CheckpointError(f"{pointer} is not a plain file naming a checkpoint of {ckpt_root}")
    try:
        name = pointer.read_text(errors="replace")[:256].strip()
    except OSError as e:
        raise CheckpointError(f"{pointer} is unreadable: {e.strerror}") from None
    target = ckpt_root / name
    if not _PLAIN_NAME.fullmatch(name) or target.is_symlink() or not target.is_dir():
        raise CheckpointError(f"{pointer} does not name a checkpoint directory inside {ckpt_root}")
    if not (target / "model.safetensors").is_file():
        raise CheckpointError(f"{pointer} names {name!r}, which is not a complete checkpoint")
    return target


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, or a run directory (then its latest checkpoint)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {str(path)!r} does not exist")
    if (path / "config.json").is_file() and (path / "model.safetensors").exists():
        if '"model_type"' in (path / "config.json").read_text(errors="replace"):
            raise CheckpointError(f"{str(path)!r} is a transformers model folder, not a nanoattn checkpoint; "
                                  f"load it with nanoattn.hf.import_hf")
        return path
    for root in (path / CHECKPOINTS, path):
        if (root / LATEST).exists() or (root / LATEST).is_symlink():
            return latest_checkpoint(root)
    raise CheckpointError(f"{str(path)!r} is neither a checkpoint (model.safetensors + config.json) "
                          f"nor a run directory with checkpoints/latest")


def read_checkpoint_config(path: str | Path) -> dict[str, Any]:
    """The checkpoint's config.json as a dict, its shape checked (one line naming the file)."""
    file = resolve_checkpoint(path) / "config.json"
    try:
        meta = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file} is unreadable or not JSON: {e}") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("model"), dict):
        raise CheckpointError(f"{file} is not a nanoattn checkpoint config: it needs a 'model' mapping")
    for key in ("train_seq_len", "step"):
        if key in meta and (not is_int(meta[key]) or meta[key] < 0):
            raise CheckpointError(f"{file}: {key}={meta[key]!r} is invalid: must be a non-negative integer")
    return meta


RUN_CONFIG = "config.yaml"  # <run dir>/config.yaml: the run's resolved RunConfig


def read_run_config(run_dir: str | Path, section: str | None = None) -> dict[str, Any]:
    """A run directory's ``config.yaml`` as a mapping, or one ``section`` of it ({} when absent);
    a file that is not YAML, not a mapping, or a section that is not one is refused naming the file."""
    file = Path(run_dir) / RUN_CONFIG
    try:
        saved = yaml.safe_load(file.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        reason = getattr(e, "strerror", None) or str(e).splitlines()[0]
        raise ValueError(f"{file} is unreadable: {reason}") from None
    if not isinstance(saved, dict):
        raise ValueError(f"{file} is not a run config (a YAML mapping of sections)")
    if section is None:
        return saved
    found = saved.get(section)
    if found is not None and not isinstance(found, dict):
        raise ValueError(f"{file}: {section}={found!r} is invalid: must be a mapping of its keys")
    return found or {}


def trained_length(meta: Mapping[str, Any]) -> int:
    """The length a checkpoint (its config.json as a dict) was trained at."""
    return int(meta.get("train_seq_len", (meta.get("model") or {}).get("max_seq_len", 0)))


def original_length(meta: Mapping[str, Any]) -> int:
    """The length a checkpoint's unscaled RoPE frequencies were fitted to (see the module docstring)."""
    earlier = (meta.get("model") or {}).get("rope_scaling") or {}
    return int(earlier.get("original_max_seq_len") or trained_length(meta))


def with_original_length(scaling: Mapping[str, Any], meta: Mapping[str, Any]) -> dict[str, Any]:
    """``scaling`` with ``original_max_seq_len`` defaulted to the checkpoint's (null counts as unset)."""
    scaling = {k: v for k, v in scaling.items() if not (k in ORIGINAL_KEYS and v is None)}
    if not set(ORIGINAL_KEYS) & set(scaling):
        scaling["original_max_seq_len"] = original_length(meta)
    return scaling


def run_directory(checkpoint: Path) -> Path:
    """The run directory of a checkpoint ``<run>/checkpoints/<name>``; else the checkpoint's parent."""
    parent = checkpoint.parent
    return parent.parent if parent.name == CHECKPOINTS else parent


def init_model_config(path: str | Path, run_model: Mapping[str, Any]) -> ModelConfig:
    """The model of a run whose weights start from checkpoint ``path``.

    The checkpoint's model config, with the ``INIT_OVERRIDABLE`` fields of ``run_model`` on top.
    A new ``rope_scaling`` mapping without ``original_max_seq_len`` gets ``original_length``.
    """
    meta = read_checkpoint_config(path)
    fields = dict(meta.get("model") or {})
    for key in INIT_OVERRIDABLE:
        if key in run_model:
            fields[key] = run_model[key]
    scaling = fields.get("rope_scaling")
    if isinstance(scaling, Mapping) and scaling is not (meta.get("model") or {}).get("rope_scaling"):
        fields["rope_scaling"] = with_original_length(scaling, meta)
    saved = ModelConfig.from_dict(meta.get("model") or {})
    if saved.length_limit is not None and fields.get("max_seq_len") != saved.max_seq_len:
        raise ValueError(f"model.max_seq_len={fields.get('max_seq_len')!r} is invalid with train.init_from: "
                         f"the checkpoint's learned position table has {saved.max_seq_len} rows "
                         f"(pos={saved.pos!r}) and cannot change")
    return ModelConfig.from_dict(fields)


def load_checkpoint(
    path: str | Path,
    *,
    rope_scaling: Mapping[str, Any] | None = None,
    device: str | torch.device = "cpu",
) -> Checkpoint:
    """Load a model, its tokenizer and config from a checkpoint or a run directory.

    ``rope_scaling`` applies a RoPE scaling zero-shot (e.g. {"type": "yarn", "factor": 4});
    its ``original_max_seq_len`` defaults to ``original_length`` (the training length when unscaled).
    """
    path = resolve_checkpoint(path)
    meta = read_checkpoint_config(path)
    model_fields = dict(meta.get("model") or {})
    cfg = ModelConfig.from_dict(model_fields)
    if rope_scaling is not None:
        if not cfg.rotary:
            raise ValueError(f"rope_scaling={dict(rope_scaling)} needs a RoPE model (a rotary encoding in "
                             f"some layer: {' | '.join(encodings_with('rotary'))}); checkpoint {path} has "
                             f"pos={cfg.pos!r}")
        model_fields["rope_scaling"] = with_original_length(rope_scaling, meta)
        cfg = ModelConfig.from_dict(model_fields)
    try:  # shapes without memory, once the weights are known to fit: config.json is not trusted
        shapes = meta_model(cfg, device)
    except ValueError as e:
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None
    check_weights_file(path / "model.safetensors", shapes)
    with torch.device(device):
        model = GPT(cfg)
    load_weights(path, model)
    tokenizer = None
    if (path / "tokenizer.json").exists():
        try:
            tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        except Exception as e:  # tokenizers raises a bare Exception for a malformed file
            reason = str(e).splitlines()[0][:120]
            raise CheckpointError(f"{path / 'tokenizer.json'} is corrupt: {reason}") from None
    return Checkpoint(model.eval(), tokenizer, cfg, path, trained_length(meta), int(meta.get("step", 0)))


def check_weights_file(file: Path, model: GPT) -> None:
    """Compare a safetensors file's header (names, shapes, dtypes) with ``model`` before reading a tensor.

    ``model`` may live on the meta device. Checkpoints hold float32 weights only: another dtype
    would be cast silently on load, so it is refused like a shape that does not fit.
    """
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if model.cfg.tie_embeddings:
        expected.pop("lm_head.weight")
    try:
        with safe_open(file, framework="pt") as f:
            header = {k: (tuple(f.get_slice(k).get_shape()), f.get_slice(k).get_dtype()) for k in f.keys()}
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} is corrupt or unreadable: {e}") from None
    missing, unexpected = sorted(set(expected) - set(header)), sorted(set(header) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{file} does not match the model config: missing {missing[:3]}, "
                              f"unexpected {unexpected[:3]}")
    for name, shape in expected.items():
        if header[name][0] != shape:
            raise CheckpointError(f"{file} does not match the model config: {name} has shape "
                                  f"{list(header[name][0])} in the file, {list(shape)} in the model")
        if header[name][1] != "F32":
            raise CheckpointError(f"{file}: {name} is {header[name][1]}, not float32 (F32); nanoattn "
                                  "checkpoints hold float32 weights")


def load_weights(path: str | Path, model: GPT) -> None:
    """Copy a checkpoint's weights into ``model``: names, shapes and dtype checked first, then finiteness."""
    file = resolve_checkpoint(path) / "model.safetensors"
    check_weights_file(file, model)
    device = next(model.parameters()).device
    try:
        state = load_file(file, device=str(device))
    except (SafetensorError, OSError) as e:
        raise CheckpointError(f"{file} is corrupt or unreadable: {e}") from None
    bad = [name for name, tensor in state.items() if not torch.isfinite(tensor).all()]
    if bad:
        raise CheckpointError(f"{file}: {bad[0]} holds NaN or infinite values"
                              + (f" (and {len(bad) - 1} more tensors)" if len(bad) > 1 else ""))
    if model.cfg.tie_embeddings:
        state["lm_head.weight"] = state["tok_emb.weight"]
    model.load_state_dict(state, strict=True)


def load_trainer_state(path: str | Path) -> dict[str, Any]:
    """The optimizer/RNG/data state, loaded without executing code (weights_only=True)."""
    file = resolve_checkpoint(path) / "trainer_state.pt"
    if not file.exists():
        raise CheckpointError(f"{file} is missing: this checkpoint cannot resume training")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except UnpicklingError as e:
        raise CheckpointError(f"{file} was refused: it holds objects beyond tensors and plain "
                              f"containers ({str(e).splitlines()[0][:120]})") from None
    except (RuntimeError, OSError, EOFError) as e:
        raise CheckpointError(f"{file} is corrupt: {str(e).splitlines()[0][:120]}") from None
