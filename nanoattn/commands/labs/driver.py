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
- A run is finished when its latest checkpoint is at its configured last step, or when that
  checkpoint ended the run at its accuracy (``train.stop_at_accuracy``: the checkpoint records the
  exact match it reached, which a run cut short at the same step lacks). Training resumes every
  run that is not (so a killed lab continues where it stopped, and adding a seed trains only the
  new runs); a run still unfinished at evaluation is shown as unfinished with its step, never as
  a result. A lab whose runs start from another lab's (``Lab.starts_from``: passkey from
  extrapolation) refuses an unfinished starting run.
- One lab at a time in a runs folder: the lab holds the folder's lock from its first check to its
  page, and a second lab there is refused in one line, so neither page loses the other's rows.
  Every output is checked before any work (``check_page_output``).
- The library never reaches into ``scripts/``: the training command is the lab script's to give
  (``Trainer``), and the lab runs it once per run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import torch

from nanoattn.checkpoint import CheckpointError, read_checkpoint_config, read_run_config, trained_length
from nanoattn.commands.eval_length import LengthEvalConfig
from nanoattn.config import ModelConfig
from nanoattn.eval.claims import Claim, Measure, degradation_column
from nanoattn.eval.results import check_page_output, git_state, record, render_page, write_page
from nanoattn.eval.runs import is_path
from nanoattn.logging import duration_text, read_metrics, training_seconds, with_progress
from nanoattn.model import GPT
from nanoattn.runtime import DTYPES, check_device_name, exclusive_lock
from nanoattn.train.run_dir import Trainer, differing_keys, reached_accuracy
from nanoattn.validation import check_bool, check_choice, check_positive_int, check_seed, fail


@dataclass
class LabRunsConfig:
    """The keys every lab has: its seeds, where its runs and its page go, how to train and evaluate."""

    owner: ClassVar[str]
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


@dataclass(frozen=True)
class Row:
    """A row of a lab: its label, the run it evaluates and the overrides that train that run."""

    label: str
    run: str  # its runs are <runs_root>/<run>/seed<k>
    train: tuple[str, ...] = ()  # () for a row that evaluates another row's runs
    scaling: Mapping[str, Any] | None = None  # a zero-shot RoPE scaling at evaluation


Report = dict[str, Any]


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


# Keys a lab's run may hold other values of: where it is and how it was watched, nothing it computed.
LAB_MAY_DIFFER = ("out_dir", "train.resume", "train.log_interval", "train.ckpt_interval", "train.keep_last",
                  "logger.")


def run_dir(runs_root: Path, run: str, seed: int) -> Path:
    return runs_root / run / f"seed{seed}"


def lab_jobs(lab: Lab, cfg: LabRunsConfig, rows: Sequence[Row], runs_root: Path) -> dict[Path, list[str]]:
    """Each run the lab trains, with the whole of its training command's overrides."""
    return {run_dir(runs_root, row.run, seed): [f"experiment={lab.experiment or lab.name}", *row.train,
                                                f"train.seed={seed}", *lab.train_extra(cfg, row, seed),
                                                *cfg.train_overrides, "logger=none"]
            for row in rows if row.train for seed in cfg.seeds}


def check_lab_runs(expected: Mapping[Path, Mapping[str, Any]]) -> None:
    """Refuse, in one line, a run directory that holds a run of other settings than the run config
    its command trains (``expected``, by run directory)."""
    for run, config in expected.items():
        if not (run / "config.yaml").exists():
            continue
        differ = differing_keys(read_run_config(run), config, LAB_MAY_DIFFER)
        if differ:
            raise ValueError(f"{run} holds a run of other settings than this lab's ({differ[0]}"
                             f"{f'; +{len(differ) - 1} more' if len(differ) > 1 else ''}): a lab never uses "
                             "it; delete it, or give the lab another runs_root")


def check_starting_runs(lab: Lab, cfg: LabRunsConfig, rows: Sequence[Row]) -> None:
    """A lab whose runs start from another lab's (``starts_from``, under ``cfg.init_root``): refuse a
    starting run that is missing or unfinished, before anything trains."""
    for row in rows:
        for seed in cfg.seeds:
            start = run_dir(Path(cfg.init_root), row.run, seed)
            went = progress(start)
            if not went.finished:
                state = "is missing" if went.step is None else f"is at step {went.step} of {went.last}"
                raise ValueError(f"{cfg.owner}: {start}, which {row.label}'s seed {seed} starts from, "
                                 f"{state}: train the {lab.starts_from} lab first (its train=true)")


class Progress(NamedTuple):
    """How far a run went (None where it has no checkpoint or no config)."""

    step: int | None  # its latest checkpoint's
    last: int | None  # its configured last step, train.max_steps
    reached: float | None  # the exact match at 1x its latest checkpoint stopped it at, if it did

    @property
    def finished(self) -> bool:
        return self.step is not None and (self.step == self.last or self.reached is not None)


def progress(run: Path) -> Progress:
    try:
        meta = read_checkpoint_config(run)
    except CheckpointError:
        meta = {}
    try:
        train = read_run_config(run, "train")
    except ValueError:
        train = {}
    reached = meta["exact_1x"] if reached_accuracy(meta, train.get("stop_at_accuracy")) else None
    return Progress(meta.get("step"), train.get("max_steps"), reached)


def is_finished(run: Path) -> bool:
    return progress(run).finished


def train_runs(command: Sequence[str], jobs: Mapping[Path, Sequence[str]], workers: int) -> None:
    """Train each run directory of ``jobs`` with ``command <its overrides>``, ``workers`` at a time,
    each on cpu_count // workers threads unless OMP_NUM_THREADS is set.

    Finished runs are skipped and any other run there is resumed. Each run's output goes to
    ``<run>.log``; a failed run is named with its log once the others are done. Interrupting the
    lab (Ctrl-C, SIGTERM) stops the trainings it started, which save and exit, so a rerun resumes them.
    """
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // workers))
    env = {**os.environ, "OMP_NUM_THREADS": threads}
    pending = [run for run in jobs if not is_finished(run)]
    running: dict[Path, tuple[subprocess.Popen, Any, float]] = {}
    failed, ended, started = [], 0, time.perf_counter()

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt  # SIGTERM would end the lab without its finally, orphaning the trainings

    previous = signal.signal(signal.SIGTERM, interrupted)
    try:
        while pending or running:
            while pending and len(running) < workers:
                run = pending.pop(0)
                resume = ["train.resume=true"] if (run / "config.yaml").exists() else []
                argv = [*command, *jobs[run], f"hydra.run.dir={run}", *resume]
                run.parent.mkdir(parents=True, exist_ok=True)
                log = run.with_name(f"{run.name}.log").open("a")
                running[run] = (subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env),
                                log, time.perf_counter())
            time.sleep(0.5)
            for run, (process, log, began) in list(running.items()):
                if process.poll() is not None:
                    log.close()
                    del running[run]
                    done = is_finished(run)
                    ended += 1
                    left = (time.perf_counter() - started) / ended * (len(pending) + len(running))
                    print(f"{run}: {'trained' if done else 'stopped'} in {time.perf_counter() - began:.0f} s "
                          f"(exit {process.returncode}); {ended} of {ended + len(pending) + len(running)} "
                          f"runs, ETA {duration_text(left)}", flush=True)
                    if process.returncode or not done:
                        failed.append(run)
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process, _, _ in running.values():
            process.send_signal(signal.SIGINT)  # the trainer saves a checkpoint and exits
        for process, log, _ in running.values():
            process.wait()
            log.close()
    if failed:
        raise ValueError(f"training did not finish {', '.join(map(str, failed))}: see <run>.log beside each")


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
    rows = lab.rows(cfg)
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
                  wall_seconds=time.perf_counter() - began,
                  training_seconds=sum(trained.values()), trained_runs=len(trained), **origin)
    path = write_page(out, page, figure=(lambda p: lab.plot(figure_reports, figure_labels, p))
                      if figure_reports else None, key=f"{cfg.owner}.out")
    print(render_page(page), end="")
    print(f"lab done in {time.perf_counter() - began:.0f} s; wrote {path} and its JSON")
    return page


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
                  **git_state())
    if earlier.get("figure") and (out / earlier["figure"]).is_file():
        page["figure"] = earlier["figure"]  # drawn from the runs' reports, which the values came from
    path = write_page(out, page, key=f"{cfg.owner}.out")
    print(render_page(page), end="")
    print(f"judged again in {time.perf_counter() - began:.0f} s; wrote {path} and its JSON")
    return page


def run_scale(run: Path) -> dict[str, int]:
    """What a finished run trained: its model's parameters, its training tokens, its training length."""
    meta = read_checkpoint_config(run)
    with torch.device("meta"):
        parameters = GPT(ModelConfig.from_dict(meta["model"])).num_params()
    tokens = [r["tokens"] for r in read_metrics(run / "metrics.jsonl") if "tokens" in r]
    return {"parameters": parameters, "tokens": tokens[-1] if tokens else 0,
            "train_length": trained_length(meta)}


def training_speed(run: Path) -> float | None:
    """Median training tokens/s of a run's logged intervals (metrics.jsonl), None if it logged none."""
    speeds = [r["tok_per_s"] for r in read_metrics(run / "metrics.jsonl") if "tok_per_s" in r]
    return statistics.median(speeds) if speeds else None


def largest_attention_logit(run: Path) -> float | None:
    """The largest ``max_attn_logit`` a run logged at its evaluations (metrics.jsonl), None if none."""
    logits = [r["max_attn_logit"] for r in read_metrics(run / "metrics.jsonl") if "max_attn_logit" in r]
    return max(logits) if logits else None



