"""What every Hydra entry point shares: dataclass schemas, the model presets, one error handler.

- ``register_schema`` stores a dataclass's fields with their *declared* defaults (nested
  dataclasses recursively) as a plain config node. Hydra then knows every key, so a misspelt
  key fails at composition, and ``--cfg job`` lists them all. Declared defaults, not an instance's:
  ``__post_init__`` fills derived values (``n_kv_head = n_head``, ``min_lr = lr / 10``) that
  must stay derived when other keys are overridden. The dataclass validates the values when the
  script builds it, each mistake in a one-line error. The YAML files state no default again.
- The groups whose options are registries are registered from them (``register_options``):
  ``model`` from ``nanoattn.config.PRESETS``, ``recipe``, ``pos`` and ``attention`` from
  ``nanoattn.config.options``, ``task`` from ``nanoattn.tasks.TASKS``. Each option is read from
  its one definition, and a new registry entry is an option with no file to add.
- ``command`` is a whole script: compose ``configs/<name>.yaml``, build its schema, call the
  library. ``guarded`` is the one error handler: a user's mistake (a bad value, a missing file,
  a Hydra composition error, Ctrl-C) ends in one ``error: ...`` line and a non-zero exit.
  Required keys are null in the schema and refused by the dataclass (``???`` would not help:
  OmegaConf's merge keeps the schema's value under it). It also sets the process's malloc
  policy first (``nanoattn.runtime.keep_freed_memory``: a step's activations are not faulted in
  again at every step).
- A training config names its run directory with two resolvers: ``${run_dir:${out_dir},<name>...}``
  checks ``out_dir`` (never empty) and the directory (``nanoattn.runtime.check_output``) before
  Hydra creates it, and ``${encoding:...}`` names a run after its encoding: the ``pos`` option
  chosen, else the model preset's own (never ``None``).
- A sweep (``-m``) runs every job: a job's failure is printed when it happens and again, with
  every other, when the sweep ends, and the script then exits with status 1. A job that would not
  compose (an unknown option, a refused run directory) is refused with its values before any job
  runs: Hydra's launcher composes each job just before it, and its error would end the sweep there.
- ``check_choices``: a training command's ``recipe=`` given with an ``experiment=`` is applied whole
  or refused in one line before the run starts, never silently overridden by the experiment's keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import hydra
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    OmegaConfBaseException,
)

from nanoattn.checkpoint import INIT_OVERRIDABLE, read_checkpoint_config
from nanoattn.config import PRESETS, RunConfig
from nanoattn.config.options import ATTENTION_VARIANTS, RECIPES, check_recipe_choice, encoding_options
from nanoattn.runtime import check_output, keep_freed_memory
from nanoattn.tasks import TASKS
from nanoattn.train.run_data import resolved_run_config
from nanoattn.train.run_dir import Trainer
from nanoattn.validation import declared_defaults, from_dict

# Absolute: hydra.main resolves a relative path against the module that calls it, which is this one.
CONFIG_PATH = str(Path(__file__).resolve().parent.parent / "configs")
# Mappings whose keys depend on a choice (each RoPE scaling type has its own parameters), so
# they are null in the configs; ``rope_scaling.type=yarn`` then means ``+rope_scaling.type=yarn``.
OPEN_MAPPINGS = ("rope_scaling.",)


# ``${pid:}`` in a default out_dir: runs started in the same second by different processes get
# different directories (under torchrun rank 0's is the one used; the others' empty ones are removed).
OmegaConf.register_new_resolver("pid", os.getpid)


def run_name(*names: Any) -> str:
    """``${run_name:<name>,...}``: a run's path below out_dir (a sweep's subdir); no part may be null."""
    if None in names:
        raise ValueError(f"a run directory named {'/'.join(map(str, names))!r} has an unnamed part: give the "
                         f"choice this experiment names its runs by (task=<name>)")
    return "/".join(map(str, names))


def run_dir(out_dir: Any, *names: Any) -> str:
    """``${run_dir:${out_dir},<name>...}``: ``<out_dir>/<name>/...``, checked before Hydra creates it."""
    check_output(out_dir, "out_dir", what="a run", folder=True)  # never empty (nor the repository)
    return str(check_output(Path(out_dir, run_name(*names)), "out_dir", what="a run", folder=True))


def encoding(choice: Any, pos: Any) -> str:
    """``${encoding:${hydra:runtime.choices.pos},${model.pos}}``: the ``pos`` option chosen, else the
    model's own encoding (one name per layer, joined by ``-``)."""
    if choice is not None:
        return str(choice)
    return pos if isinstance(pos, str) else "-".join(map(str, pos))


def swept_values(overrides: list[str]) -> list[str]:
    """A sweep job's own values: of its ``overrides``, those the command line sweeps (``a,b,c``) or the
    config's sweeper adds (not given on the command line at all)."""
    given = {arg.partition("=")[0]: arg for arg in sys.argv[1:]}
    return [o for o in overrides if "," in given.get(o.partition("=")[0], ",")]


def sweep_job_name(number: Any) -> str:
    """``${sweep_job_name:${hydra.job.num}}``: a sweep job's directory below out_dir, named by its
    swept values (``pos=alibi``, ``pos=rope,train.seed=1``); its number if it sweeps none."""
    swept = swept_values(list(HydraConfig.get().overrides.task))
    return ",".join(swept).replace("/", "_") if swept else str(number)


OmegaConf.register_new_resolver("sweep_job_name", sweep_job_name)
OmegaConf.register_new_resolver("run_name", run_name)
OmegaConf.register_new_resolver("run_dir", run_dir)
OmegaConf.register_new_resolver("encoding", encoding)


_SCHEMAS: list[dict[str, Any]] = []  # what register_schema stored, to name the allowed keys in errors


def register_schema(name: str, node: type | dict[str, Any]) -> None:
    """Store a dataclass's declared defaults (or a ready node) as config ``name``."""
    node = declared_defaults(node) if dataclasses.is_dataclass(node) else node
    _SCHEMAS.append(node)
    ConfigStore.instance().store(name=name, node=node)


def register_options() -> None:
    """The groups read from the registries, as they are when this is called."""
    store = ConfigStore.instance()
    for name, fields in PRESETS.items():
        store.store(group="model", name=name, node=dict(fields))
    for name, sections in RECIPES.items():
        store.store(group="recipe", name=name, node=dict(sections), package="_global_")
    for name, fields in encoding_options().items():
        store.store(group="pos", name=name, node=dict(fields), package="model")
    for name, fields in ATTENTION_VARIANTS.items():
        store.store(group="attention", name=name, node=dict(fields), package="model")
    for name in TASKS:
        store.store(group="task", name=name, node={"name": name}, package="task")


def _siblings(full_key: str) -> list[str]:
    """The keys a registered schema allows next to ``full_key`` (e.g. every train.* key)."""
    *parents, _ = full_key.split(".")
    for node in _SCHEMAS:
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            return sorted(node)
    return []


def one_line(error: BaseException) -> str:
    """Hydra's and OmegaConf's multi-line messages, folded into one line."""
    cause = error.__cause__ or error
    if isinstance(cause, (ConfigAttributeError, ConfigKeyError)) and "not in struct" in str(cause):
        allowed = _siblings(cause.full_key)
        return (f"unknown key {cause.full_key!r}; allowed: {', '.join(allowed)}" if allowed
                else f"unknown key {cause.full_key!r} (--cfg job lists every key)")
    while isinstance(cause, OmegaConfBaseException) and (cause.__cause__ or cause.__context__):
        cause = cause.__cause__ or cause.__context__  # a resolver's own error (run_dir), under OmegaConf's
    if isinstance(cause, ValueError) and not isinstance(cause, OmegaConfBaseException):
        return str(cause).splitlines()[0]
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    if "Config search path:" in lines:  # an unknown group option: keep the options, not the paths
        lines = lines[:lines.index("Config search path:")]
    for i, line in enumerate(lines):
        if line.startswith("Available options"):
            lines = [*lines[:i], f"{line} {', '.join(lines[i + 1:])}"]
            break
    return " ".join(ln if ln.endswith((".", ":")) else ln + "." for ln in lines)


def is_main_rank() -> bool:
    """Under torchrun only rank 0 speaks; the others exit with status 1 and say nothing."""
    return os.environ.get("RANK", "0") == "0"


def user_error(error: BaseException, errors: tuple[type[BaseException], ...] = ()) -> str | None:
    """The one line of a user's error; None for a bug (which keeps its traceback).

    User errors are ValueErrors (bad values, bad files: CheckpointError, DataError), OSErrors (a
    path that cannot be read or written), Hydra's composition errors and ``errors``.
    """
    if isinstance(error, (HydraException, OmegaConfBaseException)):
        return one_line(error)
    if isinstance(error, (ValueError, OSError, *errors)):
        return str(error).splitlines()[0] if str(error) else type(error).__name__
    return None


@contextlib.contextmanager
def one_line_errors(errors: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Turn a user's error (``user_error``, or Ctrl-C) into one ``error:`` line and a non-zero exit.

    Anything else is a bug and keeps its traceback. Used inside the ``@hydra.main`` function too,
    since Hydra prints a report of its own for an exception that leaves it.
    """
    code = 1
    try:
        yield
        return
    except KeyboardInterrupt:
        message, code = "interrupted", 130
    except Exception as e:
        message = user_error(e, errors)
        if message is None:
            raise
    sys.exit(f"error: {message}" if is_main_rank() else code)


def guarded(main: Callable[[], Any], errors: tuple[type[BaseException], ...] = ()) -> None:
    """Call ``main`` (a ``@hydra.main`` function) with every user error one line."""
    keep_freed_memory()
    os.environ["HYDRA_FULL_ERROR"] = "1"  # let Hydra's exceptions reach us instead of printing them
    sys.argv[1:] = ["+" + arg if arg.startswith(OPEN_MAPPINGS) else arg for arg in sys.argv[1:]]
    with one_line_errors(errors):
        main()


HELP_FLAGS = ("--help", "-h")


def script_help(name: str, doc: str) -> str:
    """What ``--help`` prints for the script of ``configs/<name>.yaml``: its docstring ``doc`` (what it
    does, an example), the groups its config composes with their options and default, and every key
    with its default (Hydra's own text listed every group of configs/, used or not; ``--hydra-help``
    still shows it)."""
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            cfg = compose(config_name=name, return_hydra_config=True)
            loader = GlobalHydra.instance().config_loader()
            choices = {group: choice for group, choice in cfg.hydra.runtime.choices.items()
                       if not group.startswith("hydra") and not group.endswith("_schema")}
            groups = [f"  {group}: {', '.join(sorted(loader.get_group_options(group)))} (default: {choice})"
                      for group, choice in sorted(choices.items())]
            with open_dict(cfg):
                del cfg["hydra"]
            keys = OmegaConf.to_yaml(cfg)
    finally:
        GlobalHydra.instance().clear()
    parts = [doc.strip(), ""]
    if groups:
        parts += ["Groups (group=option):", *groups, ""]
    parts += ["Keys (key=value; --cfg job prints them as composed):", keys.rstrip()]
    return "\n".join(parts) + "\n"


def help_asked(name: str) -> bool:
    """Print ``script_help`` when the command line asks for it (True: then the script stops)."""
    if HELP_FLAGS[0] not in sys.argv[1:] and HELP_FLAGS[1] not in sys.argv[1:]:
        return False
    print(script_help(name, sys.modules["__main__"].__doc__ or f"scripts/{name}.py"), end="")
    return True


def to_values(cfg: DictConfig) -> dict[str, Any]:
    return OmegaConf.to_container(cfg, resolve=True)


def command(name: str, schema: type, run: Callable[[Any], Any]) -> Callable[[], None]:
    """The whole script for ``configs/<name>.yaml``: compose, build ``schema``, call ``run``."""
    register_schema(f"{name}_schema", schema)

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=name)
    def main(cfg: DictConfig) -> None:
        with one_line_errors():
            run(from_dict(schema, to_values(cfg), owner=name))

    def script() -> None:
        if not help_asked(name):
            guarded(main)

    return script


def check_choices(hydra_cfg: DictConfig) -> None:
    """A recipe chosen on the command line (a sweep's value included) with an experiment: applied
    whole or refused (``nanoattn.config.options.check_recipe_choice``), against the keys the
    experiment's own file sets."""
    choices = hydra_cfg.runtime.choices
    recipe, experiment = choices.get("recipe"), choices.get("experiment")
    given = {override.split("=", 1)[0].lstrip("+~") for override in hydra_cfg.overrides.task}
    if recipe is None or experiment is None or "recipe" not in given:
        return
    node = OmegaConf.load(Path(CONFIG_PATH) / "experiment" / f"{experiment}.yaml")
    check_recipe_choice(recipe, experiment, OmegaConf.to_container(node), given)


def check_init_from(hydra_cfg: DictConfig, values: dict[str, Any]) -> None:
    """``train.init_from`` trains the checkpoint's model (its weights fix it): a model key the command
    line gives (``model.<key>=``, or through ``pos=`` or ``attention=``) that the checkpoint holds
    otherwise is refused in one line, where it was silently replaced, but for ``INIT_OVERRIDABLE``."""
    init_from = (values.get("train") or {}).get("init_from")
    if not init_from:
        return
    given: set[str] = set()
    for override in hydra_cfg.overrides.task:
        key, _, value = override.lstrip("+~").partition("=")
        if key.startswith("model."):
            given.add(key.split(".")[1])
        elif key in ("pos", "attention"):
            given |= set({**encoding_options(), **ATTENTION_VARIANTS}.get(value, {}))
    saved, model = read_checkpoint_config(init_from)["model"], values.get("model") or {}
    for key in sorted(given - set(INIT_OVERRIDABLE)):
        if key in saved and key in model and model[key] != saved[key]:
            raise ValueError(f"model.{key}={model[key]!r} is invalid with train.init_from={init_from}: the "
                             f"checkpoint's is {saved[key]!r}, and its weights fix the model (only "
                             f"{', '.join(INIT_OVERRIDABLE)} may change)")


# The training command a lab runs once per run: the library never reaches into scripts/.
TRAINER = (sys.executable, str(Path(__file__).resolve().with_name("train.py")))


def training_config(overrides: Sequence[str]) -> dict[str, Any]:
    """What ``TRAINER`` with ``overrides`` trains: its run config as the run's config.yaml holds it
    (``nanoattn.train.run_data.resolved_run_config``), composed here as train.py composes it."""
    register_schema("train_schema", declared_defaults(RunConfig))
    register_options()
    given = ["+" + o if o.startswith(OPEN_MAPPINGS) else o for o in overrides]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            cfg = compose(config_name="train", overrides=given, return_hydra_config=True)
            HydraConfig.instance().set_config(cfg)  # for the ${hydra:...} of an experiment's keys
            check_choices(cfg.hydra)
            hydra_cfg = cfg.hydra
            with open_dict(cfg):
                del cfg["hydra"]
            values = to_values(cfg)
            check_init_from(hydra_cfg, values)
    finally:
        GlobalHydra.instance().clear()
    return resolved_run_config(values).to_dict()


def lab_command(name: str, schema: type, run: Callable[..., Any]) -> Callable[[], None]:
    """``command`` for a lab: ``run(config, trainer=Trainer(TRAINER, training_config))``."""
    return command(name, schema, lambda cfg: run(cfg, trainer=Trainer(TRAINER, training_config)))


class Sweep:
    """The jobs of a sweep (``-m``): each runs whatever the others did, its failure noted."""

    def __init__(self) -> None:
        self.jobs = 0
        self.failed: list[str] = []

    @contextlib.contextmanager
    def job(self, errors: tuple[type[BaseException], ...]) -> Iterator[None]:
        """Run one job; a failure is printed now (a bug with its traceback) and kept for ``report``."""
        hydra_cfg = HydraConfig.get()
        swept = swept_values(list(hydra_cfg.overrides.task))
        name = f"job {hydra_cfg.job.num}" + (f" ({' '.join(swept)})" if swept else "")
        self.jobs += 1
        try:
            yield
        except Exception as e:  # Ctrl-C (KeyboardInterrupt) still stops the whole sweep
            message = user_error(e, errors)
            if message is None:
                traceback.print_exc()
                message = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            print(f"error: {name}: {message}", file=sys.stderr, flush=True)
            self.failed.append(f"{name}: {message}")

    def report(self) -> None:
        """After the sweep: every failed job again, and exit status 1 if any failed."""
        if self.failed:
            print(f"{len(self.failed)} of {self.jobs} jobs of the sweep failed:", *self.failed,
                  sep="\n  ", file=sys.stderr)
            sys.exit(f"error: {len(self.failed)} of {self.jobs} jobs of the sweep failed (listed above)")


def sweep_jobs(arguments: list[str]) -> list[list[str]]:
    """The override lists of a sweep's jobs (every combination of the swept values, as Hydra's basic
    sweeper makes them), or [] for a command without ``-m``."""
    if not {"-m", "--multirun"} & set(arguments):
        return []
    given = ["+" + a if a.startswith(OPEN_MAPPINGS) else a for a in arguments if not a.startswith("-")]
    parsed = OverridesParser.create().parse_overrides(given)
    values = [[f"{o.get_key_element()}={v}" for v in o.sweep_string_iterator()] if o.is_sweep_override()
              else [written] for o, written in zip(parsed, given, strict=True)]
    return [list(job) for job in itertools.product(*values)]


def check_sweep_composes(name: str, arguments: list[str]) -> None:
    """Compose every job of a sweep, with its run directory and its choices' checks, before any runs:
    a ValueError naming the first job that would not, and its values."""
    jobs = sweep_jobs(arguments)
    if not jobs:
        return
    swept = [i for i, values in enumerate(zip(*jobs, strict=True)) if len(set(values)) > 1]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            for number, job in enumerate(jobs):
                try:
                    cfg = compose(config_name=name, overrides=job, return_hydra_config=True)
                    with open_dict(cfg):  # as the launcher numbers its jobs
                        cfg.hydra.job.num = cfg.hydra.job.id = number
                    HydraConfig.instance().set_config(cfg)
                    str(cfg.hydra.sweep.dir), str(cfg.hydra.sweep.subdir)  # the run_dir resolver's checks
                    check_choices(cfg.hydra)
                except Exception as e:
                    message = user_error(e)
                    if message is None:
                        raise
                    values = " ".join(job[i] for i in swept)
                    raise ValueError(f"job {number} ({values}) of the sweep: {message}; no job was run"
                                     ) from e
    finally:
        GlobalHydra.instance().clear()


def training_command(name: str, schema: dict[str, Any], run: Callable[[dict[str, Any]], Any],
                     errors: tuple[type[BaseException], ...]) -> Callable[[], None]:
    """The whole script of a training entry point (train, extend_context) for ``configs/<name>.yaml``.

    The run directory is Hydra's output directory (configs/hydra/run.yaml: ``out_dir``, or
    ``<out_dir>/<job>`` in a sweep); ``run`` gets the composed values with ``out_dir`` set to it.
    ``errors`` are the training errors that are the user's to fix (a diverged run). A sweep runs
    every job and fails at its end if one did (``Sweep``).
    """
    register_schema(f"{name}_schema", schema)
    register_options()
    sweep = Sweep()

    @hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name=name)
    def main(cfg: DictConfig) -> None:
        hydra_cfg = HydraConfig.get()
        hydra_dir = Path(hydra_cfg.runtime.output_dir)
        guard = sweep.job(errors) if hydra_cfg.mode == RunMode.MULTIRUN else one_line_errors(errors)
        try:
            with guard:
                check_choices(hydra_cfg)
                values = to_values(cfg)
                check_init_from(hydra_cfg, values)
                run({**values, "out_dir": str(hydra_dir)})
        finally:
            # Hydra creates its output directory before we run; drop it if it stayed empty (a failed
            # start, a resume that continues another directory, or a torchrun rank whose ${now:} differed).
            with contextlib.suppress(OSError):
                hydra_dir.rmdir()

    def script() -> None:
        if help_asked(name):
            return
        with one_line_errors(errors):
            check_sweep_composes(name, sys.argv[1:])
        guarded(main, errors)
        sweep.report()

    return script
