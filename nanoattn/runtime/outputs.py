"""Outputs: every path a command writes passes ``check_output`` first, one rule for all of them.

Never an empty path, never a repository's root as a folder to fill, never inside a checkpoint
(pruning deletes it; a model folder holds a model's files only), and an existing file is replaced
only when the command recognises it, by name and format, as its own earlier output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

CHECKPOINTS = "checkpoints"  # <run dir>/checkpoints/<name>/ (nanoattn.checkpoint's layout)
MODEL_WEIGHTS = "model.safetensors"  # in every checkpoint and every transformers model folder
RUN_CONFIG = "config.yaml"  # <run dir>/config.yaml: a run directory's mark
CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding the nanoattn package: its repository


def is_repository_root(folder: Path) -> bool:
    """A repository's root: a folder holding ``.git`` (a checkout, a worktree), or this package's checkout."""
    folder = folder.resolve()
    return (folder / ".git").exists() or folder == CHECKOUT


def checkpoint_holding(path: Path) -> Path | None:
    """The run's checkpoints/ folder, or the checkpoint or model folder (holding model.safetensors),
    that is or holds ``path``; None when there is none. A model folder that *is* ``path`` does not
    count: an output folder that exists is its caller's to check (an export's must be empty)."""
    path = path.resolve()
    for folder in (path, *path.parents):
        if folder.name == CHECKPOINTS and folder.is_dir() and (folder.parent / RUN_CONFIG).is_file():
            return folder
        if folder != path and (folder / MODEL_WEIGHTS).is_file():
            return folder
    return None


def json_object_with(path: Path, keys: Sequence[str]) -> bool:
    """True when ``path`` holds a JSON object with every one of ``keys``: how a command recognises
    its own earlier JSON output."""
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(found, dict) and all(key in found for key in keys)


def check_output(path: str | os.PathLike | None, key: str, *, what: str = "", folder: bool = False,
                 ours: Callable[[Path], bool] | None = None, suffix: str | None = None,
                 beside: Sequence[Path] = ()) -> Path:
    """``path`` as a Path when the command that ``key`` belongs to may write it; else a one-line
    ValueError naming ``key``, the value and what is allowed. Every output of every command
    passes here (see the module docstring):

    - ``folder``: a folder the command fills (a run, a head analysis, an export), never a
      repository's root nor a file; it may exist, and what it holds is its caller's to check;
    - else a file of ``what`` (``an evaluation report``), ending in ``suffix`` if given: an
      existing one is replaced only when ``ours(file)`` recognises it as this command's earlier
      output, and the files written ``beside`` it (its figure) only when it is;
    - never empty, never inside a checkpoint or a run's checkpoints/ folder.
    """
    noun = "folder" if folder else "file"
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"{key}={path!r} is invalid: an empty path; give a {noun} path")
    path = Path(path)
    shown, short = f"{key}={str(path)!r}", key.rpartition(".")[2]
    if folder and is_repository_root(path):
        raise ValueError(f"{shown} is invalid: it is the root of the repository {path.resolve()}; give "
                         f"{what or 'the output'} a folder of its own (e.g. runs/<name>)")
    holder = checkpoint_holding(path)
    if holder is not None:
        where = "it is" if holder == path.resolve() else "it is inside"
        raise ValueError(f"{shown} is invalid: {where} {holder}, which holds checkpoints or a model's files, "
                         "never other outputs (pruning deletes checkpoints); write beside it")
    if folder:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{key} {str(path)!r} is a file; {what or 'the output'} needs a directory")
        return path
    if suffix is not None and path.suffix != suffix:
        raise ValueError(f"{shown} is invalid: {what} is a {suffix} file")
    if path.is_dir():
        raise ValueError(f"{shown} is a folder; give a file path for {what}")
    mine = path.exists() and ours is not None and ours(path)
    if path.exists() and not mine:
        raise ValueError(f"{key}: {path} exists and is not {what}: never overwritten; choose another {short}")
    for other in beside:
        if other.exists() and not mine:
            raise ValueError(f"{key}: {other} exists without {what} beside it, so it is not ours to "
                             f"overwrite; choose another {short}")
    return path
