"""The labs' driver: rows over seeds, trained and evaluated alike, published as a results page.

Design choices:

- A lab (``Lab``) is a list of rows, one evaluation per run, the columns a report gives, a
  figure, and the papers' claims its rows test. ``run_lab`` runs every lab the same way: train
  (with ``train=true``) each row at each seed, ``<runs_root>/<row>/seed<k>``, with the lab
  script's training command and ``experiment=<lab>`` (or the one the lab names); evaluate every
  finished run; write the results page (``nanoattn.eval.results``: every seed's values, means
  with 95% intervals, the claims decided by their intervals) to ``<out>/<lab>.{json,md,png}``.
- Runs land in ``runs/<lab>/`` and the page beside them, so a lab run with its defaults leaves
  the checkout unchanged; ``out=docs/results`` publishes the page.
- A run is the lab's only if it is the run the lab's command trains: before anything is trained or
  evaluated, every run directory's ``config.yaml`` is compared key by key with what the training
  command resolves to for that row and seed (``Trainer.resolve``), and a run of other settings is
  refused in one line naming the first key that differs (only ``LAB_MAY_DIFFER``, where and how a
  run is watched, may). So a page never mixes runs of another command, and a row's seeds share every
  key but the seed.
- Training resumes every run that is not finished (``runs.py`` says when a run is), so a killed lab
  continues where it stopped, and adding a seed trains only the new runs; a run still unfinished at
  evaluation is shown as unfinished with its step, never as a result. A lab whose runs start from
  another lab's (``Lab.starts_from``: passkey from extrapolation) refuses an unfinished starting run.
- One lab at a time in a runs folder: the lab holds the folder's lock from its first check to its
  page, and a second lab there is refused in one line, so neither page loses the other's rows.
  Every output is checked before any work (``check_page_output``).
- ``quick=true`` is a lab's first look, in minutes: its ``Quick`` form's rows, one seed, a few
  training steps, under ``runs/<lab>_quick`` (its runs never meet the full lab's) with its page
  beside them; it is not for publishing, so it refuses ``out`` and ``values_from``.
- The library never reaches into ``scripts/``: the training command is the lab script's to give
  (``Trainer``), and the lab runs it once per run.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from nanoattn.commands.eval_length import LengthEvalConfig
from nanoattn.commands.labs.runs import (
    check_lab_runs,
    check_starting_runs,
    lab_jobs,
    progress,
    run_dir,
    run_scale,
    train_runs,
)
from nanoattn.commands.labs.scales import SCALES, at_scale, check_scale_device
from nanoattn.eval.claims import Claim, Measure, degradation_column
from nanoattn.eval.results import check_page_output, git_state, record, render_page, write_page
from nanoattn.eval.runs import is_path
from nanoattn.logging import read_metrics, training_seconds, with_progress
from nanoattn.runtime import DTYPES, check_device_name, exclusive_lock
from nanoattn.train.run_dir import Trainer
from nanoattn.validation import check_bool, check_choice, check_positive_int, check_seed, fail


@dataclass
class LabRunsConfig:
    """The keys every lab has: its seeds, where its runs and its page go, how to train and evaluate."""

    owner: ClassVar[str]
    # The keys that choose which rows run (a page lists the lab's other rows as not run).
    row_keys: ClassVar[tuple[str, ...]] = ()
    seeds: list[int] = dataclasses.field(default_factory=lambda: [0, 1, 2])  # a run per row and seed
    runs_root: str | None = None  # where the runs are; None: runs/<lab>
    out: str | None = None  # the page's folder; None: the runs' (docs/results publishes it)
    max_tokens: int = LengthEvalConfig.max_tokens  # perplexity labs: targets scored at every length
    batch_size: int = LengthEvalConfig.batch_size
    dtype: str = LengthEvalConfig.dtype
    device: str = LengthEvalConfig.device
    train: bool = False  # first train (or finish) every run the lab evaluates, `workers` at a time
    workers: int = 2  # trainings at once with train=true; each gets cpu_count // workers threads
    train_overrides: list[str] = dataclasses.field(default_factory=list)  # e.g. [train.max_steps=500]
    # An earlier page of this lab (its JSON): its every seed's values judged again by this checkout's
    # summaries and claims, nothing trained or evaluated; the page says which command measured them.
    values_from: str | None = None
    quick: bool = False  # the lab's quick form (Lab.quick): a first look in minutes, not a page to cite
    scale: str = "cpu"  # cpu | gpu: the same rows at the GPT-2-small shape on a CUDA GPU (scales.py)

    def __post_init__(self) -> None:
        own = self.owner
        if isinstance(self.seeds, (str, bytes)) or not isinstance(self.seeds, Sequence) or not self.seeds:
            fail(own, "seeds", self.seeds, "must be a non-empty list of seeds")
        for seed in self.seeds:
            check_seed(own, "seeds", seed)
        if len(set(self.seeds)) != len(self.seeds):
            fail(own, "seeds", self.seeds, "must not repeat a seed")
        self.seeds = list(self.seeds)
        check_bool(own, "train", self.train)
        check_bool(own, "quick", self.quick)
        check_choice(own, "scale", self.scale, SCALES)
        if self.quick and (self.out is not None or self.values_from is not None):
            given = "out" if self.out is not None else "values_from"
            fail(own, given, getattr(self, given), "must be null with quick=true (a quick page is a first "
                 "look under runs/<lab>_quick, never one to publish or judge again)")
        check_positive_int(own, "workers", self.workers)
        if not isinstance(self.train_overrides, (list, tuple)) or not all(
                isinstance(o, str) and "=" in o for o in self.train_overrides):
            fail(own, "train_overrides", self.train_overrides, "must be a list of key=value overrides")
        self.train_overrides = list(self.train_overrides)
        for name in ("runs_root", "out", "values_from"):
            if getattr(self, name) is not None and not is_path(getattr(self, name)):
                fail(own, name, getattr(self, name), "must be a folder or null")
        for name in ("max_tokens", "batch_size"):
            check_positive_int(own, name, getattr(self, name))
        check_choice(own, "dtype", self.dtype, DTYPES)
        check_device_name(own, "device", self.device)

    def every_row(self) -> LabRunsConfig:
        """This config with its row keys at their defaults: the lab's whole default set of rows."""
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self) if f.name in self.row_keys}
        return dataclasses.replace(self, **defaults)


@dataclass(frozen=True)
class Row:
    """A row of a lab: its label, the run it evaluates and the overrides that train that run."""

    label: str
    run: str  # its runs are <runs_root>/<run>/seed<k>
    train: tuple[str, ...] = ()  # () for a row that evaluates another row's runs
    scaling: Mapping[str, Any] | None = None  # a zero-shot RoPE scaling at evaluation


Report = dict[str, Any]


@dataclass(frozen=True)
class Quick:
    """A lab's quick form: the rows it runs (labels), the training overrides that shorten their runs,
    and the lab keys it sets (fewer instances to score, the starting lab's quick runs)."""

    rows: tuple[str, ...]
    train: tuple[str, ...]
    keys: Mapping[str, Any] = dataclasses.field(default_factory=dict)


@dataclass(frozen=True)
class Lab:
    """One experiment: its rows, one run's evaluation, the page's columns and figure, its claims."""

    name: str  # runs/<name>/, <name>.md, and the experiment=<name> its runs train with
    title: str
    about: str
    rows: Callable[[Any], list[Row]]
    evaluate: Callable[[Any, Path, Row], Report]
    cells: Callable[[Report], dict[str, float | None]]
    # The figure of the rows' reports averaged over seeds (``mean_report``); None: the page has none.
    plot: Callable[[Sequence[Report], Sequence[str], Path], Path] | None
    claims: tuple[Claim, ...] = ()
    # Extra training overrides of one run: (config, row, seed) -> overrides.
    train_extra: Callable[[Any, Row, int], list[str]] = lambda cfg, row, seed: []
    # A row's status from its cells over the seeds, None when its numbers stand (task lab: not learned).
    status: Callable[[Mapping[str, Sequence[float | None]]], str | None] = lambda cells: None
    # Lines the page states below its table, from every row's cells (the task budget: the budget).
    notes: Callable[[Mapping[str, Mapping[str, Sequence[float | None]]]], list[str]] = lambda values: []
    experiment: str | None = None  # the experiment its runs train with; None: its name
    # The instances behind one value of a rate column (exact match, retrieval), None for other columns.
    rates: Callable[[Any, str], int | None] = lambda cfg, column: None
    # The lab whose runs this lab's start from (``train.init_from``), each row's at the same seed.
    starts_from: str | None = None
    quick: Quick | None = None  # its quick form (``quick=true``)
    gpu: tuple[str, ...] = ()  # its own training overrides at scale=gpu beyond the shared ones (scales.py)
    scaled: tuple[str, ...] = ()  # the overrides of the scale it runs at (set by ``scales.at_scale``)


def mean_report(reports: Sequence[Report]) -> Report:
    """The first report with each numeric field of its ``results`` averaged over ``reports``."""
    first = dict(reports[0])
    results = []
    for entries in zip(*(r["results"] for r in reports), strict=True):
        entry = dict(entries[0])
        for key, value in entry.items():
            numbers = [e[key] for e in entries if isinstance(e.get(key), (int, float)) and not isinstance(
                e.get(key), bool)]
            if isinstance(value, (int, float)) and not isinstance(value, bool) and numbers:
                entry[key] = statistics.fmean(numbers)
        results.append(entry)
    return {**first, "results": results}


def run_lab(lab: Lab, cfg: LabRunsConfig, trainer: Trainer) -> dict[str, Any]:
    """Train (with ``cfg.train``) and evaluate every row at every seed; write and print the page.
    One lab at a time in a runs folder (see the module docstring)."""
    lab = at_scale(lab, cfg.scale)
    if cfg.train:
        check_scale_device(cfg.scale, cfg.owner)
    if cfg.quick:
        cfg = quick_config(lab, cfg)
    runs_root = Path(cfg.runs_root or f"runs/{lab.name}")
    out = Path(cfg.out) if cfg.out is not None else runs_root
    check_page_output(out, lab.name, f"{cfg.owner}.out")  # before hours of training, not after
    with exclusive_lock(runs_root, f"the runs folder {runs_root} (another lab)"):
        return _run_lab(lab, cfg, trainer, runs_root, out)


def _run_lab(lab: Lab, cfg: LabRunsConfig, trainer: Trainer, runs_root: Path, out: Path) -> dict[str, Any]:
    if cfg.values_from is not None:
        return judge_again(lab, cfg, out)
    began = time.perf_counter()
    origin = git_state()  # the code that trains and evaluates: the checkout as the lab starts
    rows = [row for row in lab.rows(cfg) if not cfg.quick or row.label in lab.quick.rows]
    if lab.starts_from is not None:
        check_starting_runs(lab, cfg, rows)
    jobs = lab_jobs(lab, cfg, rows, runs_root)
    expected = {run: trainer.resolve(overrides) for run, overrides in jobs.items()}
    check_lab_runs(expected)
    if cfg.train:
        train_runs(trainer.command, jobs, cfg.workers)
        check_lab_runs(expected)  # what the trainings wrote
    missing = sorted({str(run_dir(runs_root, row.run, seed)) for row in rows for seed in cfg.seeds
                      if not run_dir(runs_root, row.run, seed).is_dir()})
    if missing:
        raise ValueError(f"no run directory {missing[0]} (and {len(missing) - 1} more); run the lab with "
                         "train=true to train them")
    values: dict[str, dict[str, list[float | None]]] = {}
    status: dict[str, str] = {}
    scales: dict[str, dict[str, int]] = {}
    figure_reports, figure_labels = [], []
    trained: dict[Path, float] = {}  # each finished run's training seconds (rows may share runs)
    for row in with_progress(rows, f"{lab.name} lab: rows evaluated"):
        reports, unfinished = [], []
        for seed in cfg.seeds:
            run = run_dir(runs_root, row.run, seed)
            went = progress(run)
            if not went.finished:
                unfinished.append(f"seed {seed} at step {went.step} of {went.last}")
                reports.append(None)
                continue
            reports.append(lab.evaluate(cfg, run, row))
            trained[run] = training_seconds(read_metrics(run / "metrics.jsonl"))[-1]
            scales.setdefault(row.label, run_scale(run))
        cells = [lab.cells(r) if r is not None else None for r in reports]
        columns = list(dict.fromkeys(c for one in cells if one for c in one))
        values[row.label] = {c: [one.get(c) if one else None for one in cells] for c in columns}
        row_status = "unfinished: " + ", ".join(unfinished) if unfinished else lab.status(values[row.label])
        if row_status:
            status[row.label] = row_status
        done = [r for r in reports if r is not None]
        if done and lab.plot is not None:
            figure_reports.append(mean_report(done))
            figure_labels.append(row.label)
    rates = {c: n for c in dict.fromkeys(c for row in values.values() for c in row)
             if (n := lab.rates(cfg, c)) is not None}
    page = record(lab.name, lab.title, lab.about, cfg.seeds, values, claims=lab.claims, status=status,
                  notes=lab.notes(values), measure=Measure(rates), scales=scales,
                  not_run=not_run(lab, cfg, values),
                  wall_seconds=time.perf_counter() - began,
                  training_seconds=sum(trained.values()), trained_runs=len(trained), **origin)
    path = write_page(out, page, figure=(lambda p: lab.plot(figure_reports, figure_labels, p))
                      if figure_reports else None, key=f"{cfg.owner}.out")
    print(render_page(page), end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {path} and its JSON")
    return page


def quick_config(lab: Lab, cfg: LabRunsConfig) -> LabRunsConfig:
    """``cfg`` in ``lab``'s quick form: one seed, its runs under runs/<lab>_quick, shortened; the
    command's own training overrides come after the quick form's, so they win."""
    if lab.quick is None:
        fail(cfg.owner, "quick", cfg.quick, f"the {lab.name} lab has no quick form")
    return dataclasses.replace(cfg, seeds=[0], runs_root=cfg.runs_root or f"runs/{lab.name}_quick",
                               train_overrides=[*lab.quick.train, *cfg.train_overrides], **lab.quick.keys)


def not_run(lab: Lab, cfg: LabRunsConfig, values: Mapping[str, Any]) -> list[str]:
    """The labels of the lab's default rows (at this checkout's registries) that ``values`` lacks."""
    return [row.label for row in lab.rows(cfg.every_row()) if row.label not in values]


# What a page says of how its values were measured, kept when they are judged again.
MEASURED = ("command", "commit", "dirty", "date", "machine", "wall_seconds", "training_seconds",
            "trained_runs")


def judge_again(lab: Lab, cfg: LabRunsConfig, out: Path) -> dict[str, Any]:
    """The page of ``cfg.values_from``'s values (an earlier page of ``lab`` at the same seeds) with the
    summaries, rates and verdicts of this checkout, and what measured them (its ``measured``)."""
    began = time.perf_counter()
    source = Path(cfg.values_from)
    try:
        earlier = json.loads(source.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{cfg.owner}.values_from={cfg.values_from!r} cannot be read as a page: {e}"
                         ) from None
    if not isinstance(earlier, dict) or earlier.get("page") != lab.name or earlier.get("seeds") != cfg.seeds:
        raise ValueError(f"{cfg.owner}.values_from={cfg.values_from!r} is invalid: must be a page of the "
                         f"{lab.name} lab at seeds {cfg.seeds} (give its seeds)")
    derived = tuple(degradation_column(claim.column) for claim in lab.claims if claim.degradation)
    values = {row["label"]: {c: v for c, v in row["values"].items() if c not in derived}
              for row in earlier["rows"]}
    status = {row["label"]: row["status"] for row in earlier["rows"]
              if (row["status"] or "").startswith("unfinished")}
    status.update({label: s for label, cells in values.items() if label not in status
                   and (s := lab.status(cells)) is not None})
    rates = {c: n for c in dict.fromkeys(c for row in values.values() for c in row)
             if (n := lab.rates(cfg, c)) is not None}
    page = record(lab.name, lab.title, lab.about, cfg.seeds, values, claims=lab.claims, status=status,
                  notes=lab.notes(values), measure=Measure(rates),
                  scales={row["label"]: row["scale"] for row in earlier["rows"] if row.get("scale")},
                  measured=earlier.get("measured") or {k: earlier[k] for k in MEASURED if k in earlier},
                  not_run=not_run(lab, cfg, values),
                  **git_state())
    if earlier.get("figure") and (out / earlier["figure"]).is_file():
        page["figure"] = earlier["figure"]  # drawn from the runs' reports, which the values came from
    path = write_page(out, page, key=f"{cfg.owner}.out")
    print(render_page(page), end="")
    print(f"judged again in {time.perf_counter() - began:.0f} s; wrote {path} and its JSON")
    return page
