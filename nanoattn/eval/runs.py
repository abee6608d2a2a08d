"""What every checkpoint evaluation shares: loading a run's model and data, its report files.

Design choices:

- One rule for a run's data folder (``run_data_dir``): the run directory's ``config.yaml``
  names it (``data.root``/``data.name``, through the data layer's own ``data_dir``, so a relative
  root means the current directory, as training took it); without one, the default
  ``DataConfig``'s folder. An explicit ``data_dir`` always wins.
- One tokenizer check (``load_for_eval``, ``TokenData.check_tokenizer`` as training uses it):
  the data's tokenizer must be the checkpoint's, whole, not only its size. A checkpoint without
  a tokenizer.json has nothing to compare and is trusted.
- Report files are named after the run (``default_output``), so evaluations of one run under
  different zero-shot scalings, at older checkpoints or with another seed (a command's
  ``file_keys`` away from their defaults) never overwrite each other, and are written
  atomically: a reader never sees half a report. A report replaces only an earlier report
  (``nanoattn.runtime.check_output``), and says so when that one was made with other settings.
- The keys the commands share are two base dataclasses, each field checked once in
  ``__post_init__`` and named after the command (``owner``): ``CheckpointEvalConfig`` (what to
  load), ``ReportConfig`` (a report file and its figure: eval_task) and ``AtLengthsConfig`` (a
  report at several lengths: eval_length, eval_passkey).
  A field is checked on its own there; the measurement functions check combinations (a stride
  with chunks, a stride past the shortest length).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nanoattn.checkpoint import (
    LATEST,
    RUN_CONFIG,
    Checkpoint,
    load_checkpoint,
    read_run_config,
    resolve_checkpoint,
    run_directory,
)
from nanoattn.config import DataConfig
from nanoattn.data import TokenData, data_dir
from nanoattn.eval.length import DEFAULT_MULTIPLES, check_lengths, check_multiples, lengths_from_multiples
from nanoattn.logging import note
from nanoattn.model import check_forward_fits
from nanoattn.runtime import (
    DTYPES,
    check_device_name,
    check_output,
    json_object_with,
    pick_device,
    write_atomic,
)
from nanoattn.validation import check_bool, check_choice, check_positive_int, fail


def is_path(value: Any) -> bool:
    """A non-empty path, as a string or a ``Path``."""
    return isinstance(value, (str, os.PathLike)) and bool(str(value).strip())


@dataclass
class CheckpointEvalConfig:
    """What every evaluation of a checkpoint loads: the checkpoint, its data, the device."""

    owner: ClassVar[str]  # set by each command's config: its name, which prefixes every error

    ckpt: str | None = None  # required: a checkpoint directory, or a run directory (its latest checkpoint)
    data_dir: str | None = None  # None: the run's config.yaml data.root/data.name, else data/shakespeare
    device: str = "cpu"  # auto | cpu | cuda | cuda:<index> | mps

    def __post_init__(self) -> None:
        if not is_path(self.ckpt):
            fail(self.owner, "ckpt", self.ckpt, "required: a checkpoint or run directory (ckpt=runs/...)")
        if self.data_dir is not None and not is_path(self.data_dir):
            fail(self.owner, "data_dir", self.data_dir, "must be a prepared data folder or null")
        check_device_name(self.owner, "device", self.device)


@dataclass
class ReportConfig(CheckpointEvalConfig):
    """An evaluation of a checkpoint, optionally under a zero-shot RoPE scaling, written as a report."""

    report_stem: ClassVar[str]  # set by each command's config: <run dir>/<report_stem>[...].json
    # Keys named in the default file away from their default, each by its tag ("" : its value alone).
    file_keys: ClassVar[dict[str, str]] = {}

    batch_size: int = 4  # windows (or samples) per forward pass
    dtype: str = "float32"  # auto | float32 | bfloat16 | float16: autocast, the weights stay float32
    rope_scaling: dict[str, Any] | None = None  # zero-shot, e.g. {type: yarn, factor: 4}; RoPE models only
    out: str | None = None  # None: <run dir>/<report>[_<scaling>][_step<N>].json; the figure beside it
    plot: bool = True  # draw the figure (.png beside out)

    def __post_init__(self) -> None:
        super().__post_init__()
        own = self.owner
        check_positive_int(own, "batch_size", self.batch_size)
        check_choice(own, "dtype", self.dtype, DTYPES)
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Mapping):
            fail(own, "rope_scaling", self.rope_scaling, "must be a mapping {type: ..., factor: ...} or null")
        if self.out is not None and not is_path(self.out):
            fail(own, "out", self.out, "must be a file path or null")
        check_bool(own, "plot", self.plot)

    def load(self) -> tuple[Checkpoint, TokenData]:
        """``load_for_eval`` of this checkpoint, scaling, device and data folder, once the report's
        path is known to be writable (``check_report_output``): a refusal comes before any work."""
        check_report_output(self.output(), self.plot, f"{self.owner}.out")
        return load_for_eval(self.ckpt, rope_scaling=self.rope_scaling, device=self.device,
                             data_dir=self.data_dir)

    def output(self) -> Path:
        """``out``, or else the run's default report file (``default_output`` of ``report_stem``)."""
        if self.out is not None:
            return Path(self.out)
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        tags = [f"{tag}{getattr(self, key)}" for key, tag in self.file_keys.items()
                if getattr(self, key) != defaults[key]]
        return default_output(self.ckpt, self.rope_scaling, self.report_stem, tags)

    def label(self) -> str:
        """The report's name in tables and figures (``report_label``)."""
        return report_label(self.output(), self.report_stem)

    def save(self, report: Mapping[str, Any], plot: Callable[[list, list, Path], Any]) -> Path:
        """Write ``report`` to ``output()`` and, with ``plot`` on, ``plot([report], [label], <out>.png)``.

        Only files this command writes are replaced (``check_report_output``): ``out=`` never
        overwrites a run's config.yaml or any other file that is not an earlier report. Replacing
        a report made with other settings says which.
        """
        out = self.output()
        check_report_output(out, self.plot, f"{self.owner}.out")
        changed = changed_settings(out, report)
        if changed:
            note(f"{self.owner}: replacing {out}, made with {changed}")
        write_report(out, report)
        if self.plot:
            plot([report], [self.label()], out.with_suffix(".png"))
        return out

    def written(self) -> str:
        """What ``save`` wrote, as a line for the console."""
        out = self.output()
        return f"wrote {out}" + (f" and {out.with_suffix('.png')}" if self.plot else "")


@dataclass
class AtLengthsConfig(ReportConfig):
    """An evaluation at several lengths (eval_length, eval_passkey)."""

    lengths: list[int] | None = None  # in tokens; None: multiples of the checkpoint's training length
    multiples: Sequence[float] = DEFAULT_MULTIPLES

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.lengths is not None:
            check_lengths(self.owner, self.lengths)
        check_multiples(self.owner, self.multiples)
        self.multiples = tuple(self.multiples)  # the declared default's type, whatever the caller passed

    def lengths_for(self, checkpoint: Checkpoint, rows: int | None = None) -> list[int]:
        """``lengths`` ascending, or else ``multiples`` of the checkpoint's training length; refused
        (naming the key) when a forward pass over ``rows`` (default ``batch_size``) windows of the
        longest cannot fit the model's device."""
        if self.lengths is not None:
            lengths = check_lengths(self.owner, self.lengths)
            key = (self.owner, "lengths", list(self.lengths))
        else:
            lengths = lengths_from_multiples(checkpoint.train_seq_len, self.multiples, self.owner)
            key = (self.owner, "multiples", list(self.multiples))
        device = next(checkpoint.model.parameters()).device
        check_forward_fits(checkpoint.config, rows or self.batch_size, lengths[-1], device, key)
        return lengths


def run_data_dir(checkpoint_path: Path) -> Path:
    """The data folder the run of a (resolved) checkpoint trained on; see the module docstring."""
    run = run_directory(checkpoint_path)
    if (run / RUN_CONFIG).is_file():
        data = read_run_config(run, "data")
        if data.get("root") and data.get("name"):
            return data_dir(DataConfig(root=data["root"], name=data["name"]))
    return data_dir(DataConfig())


def load_for_eval(ckpt: str | Path, *, rope_scaling: Mapping[str, Any] | None = None, device: str = "cpu",
                  data_dir: str | Path | None = None) -> tuple[Checkpoint, TokenData]:
    """(checkpoint with ``rope_scaling`` applied zero-shot, TokenData of ``data_dir`` or else the run's).

    Refuses data whose tokenizer is not the checkpoint's: its ids would mean other tokens.
    """
    rope_scaling = None if rope_scaling is None else dict(rope_scaling)
    checkpoint = load_checkpoint(ckpt, rope_scaling=rope_scaling, device=pick_device(device))
    data = TokenData(Path(data_dir) if data_dir is not None else run_data_dir(checkpoint.path))
    if checkpoint.tokenizer is not None:
        data.check_tokenizer(checkpoint.tokenizer, checkpoint.path / "tokenizer.json")
    return checkpoint, data


def checkpoint_fields(checkpoint: Checkpoint) -> dict[str, Any]:
    """The fields every report opens with: which checkpoint, its step, encoding and training length."""
    return {"checkpoint": str(checkpoint.path), "step": checkpoint.step, "pos": checkpoint.config.pos,
            "train_seq_len": checkpoint.train_seq_len}


def scaling_tag(rope_scaling: Mapping[str, Any]) -> str:
    """A file-name tag for a scaling override: its type and factor, then other keys, e.g. ``yarn4``."""
    rest = {k: v for k, v in rope_scaling.items() if k not in ("type", "factor")}
    tag = f"{rope_scaling.get('type', '')}{_number_text(rope_scaling.get('factor', ''))}"
    tag += "".join(f"_{k}{_number_text(v)}" for k, v in sorted(rest.items()))
    return re.sub(r"[^A-Za-z0-9._-]", "", tag)


def _number_text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def default_output(ckpt: str | Path, rope_scaling: Mapping[str, Any] | None, stem: str,
                   tags: Sequence[str] = ()) -> Path:
    """``<run dir>/<stem>.json``; ``_<scaling tag>`` with an override, then ``_<tag>`` for each of
    ``tags`` (``seed1``), ``_step<N>`` unless the latest."""
    path = resolve_checkpoint(ckpt)
    if rope_scaling:
        stem += "_" + scaling_tag(rope_scaling)
    stem += "".join(f"_{re.sub(r'[^A-Za-z0-9._-]', '', tag)}" for tag in tags)
    latest = path.parent / LATEST
    if latest.exists() and latest.read_text().strip() != path.name:
        stem += f"_step{json.loads((path / 'config.json').read_text()).get('step', path.name)}"
    return run_directory(path) / f"{stem}.json"


def report_label(file: Path, stem: str) -> str:
    """A report's name in plots and tables: its run directory, plus the file's suffix (``rope/yarn4``)."""
    suffix = file.stem.removeprefix(stem).lstrip("_")
    return file.parent.name + (f"/{suffix}" if suffix else "")


REPORT_KEYS = ("checkpoint", "results")  # every report (length, passkey) has these
MEASURED = ("results", "seconds", "per_position_loss", "per_position_length")  # not settings


def is_report(path: Path) -> bool:
    """True when ``path`` holds an evaluation report (a JSON object with ``REPORT_KEYS``)."""
    return json_object_with(path, REPORT_KEYS)


def check_report_output(out: Path, plot: bool, key: str) -> None:
    """``check_output`` of a report: a ``.json`` file replacing only an earlier report (its figure
    beside it counts as ours only when the report is)."""
    check_output(out, key, what="an evaluation report", ours=is_report, suffix=".json",
                 beside=[out.with_suffix(".png")] if plot else [])


def changed_settings(out: Path, report: Mapping[str, Any]) -> str:
    """The settings (every key but ``MEASURED``) of the earlier report at ``out`` that ``report``
    changes, as ``seed=0 (now 1), ...``; empty when there is none or nothing changed."""
    if not is_report(out):
        return ""
    old, new = json.loads(out.read_text()), json.loads(json.dumps(report))
    return ", ".join(f"{k}={old[k]!r} (now {new[k]!r})" for k in new
                     if k in old and k not in MEASURED and old[k] != new[k])


def write_report(path: str | Path, report: Mapping[str, Any]) -> Path:
    """``report`` as indented JSON at ``path`` (parents created), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, json.dumps(report, indent=1) + "\n")
