"""configs/train.yaml composes, with every model preset, positional encoding, logger and experiment,
into a valid RunConfig; the model group is nanoattn.config.PRESETS, registered by the scripts."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf, open_dict, read_write

from nanoattn.bench.core import BenchConfig
from nanoattn.bench.labs import LAB_JOBS
from nanoattn.bench.speedrun import recipe
from nanoattn.commands.labs import BUDGET_FACTOR, LEARNED
from nanoattn.config import PRESETS, LoggerConfig, RunConfig, TrainConfig, preset
from nanoattn.config.options import ATTENTION_VARIANTS, RECIPES, as_overrides, encoding_options
from nanoattn.model import GPT
from nanoattn.positional import REGISTRY
from nanoattn.tasks import TASKS

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
sys.path.insert(0, str(REPO / "scripts"))
from _hydra_cli import (  # noqa: E402  (scripts/ is not a package)
    check_choices,
    one_line,
    register_options,
    register_schema,
)

register_schema("train_schema", RunConfig)
register_options()


def _names(group: str) -> list[str]:
    return sorted(p.stem for p in (CONFIGS / group).glob("*.yaml"))


def _options(group: str) -> list[str]:
    """The options Hydra offers for ``group``: its files and the registered nodes."""
    registered = (name.removesuffix(".yaml") for name in ConfigStore.instance().repo[group])
    return sorted({*_names(group), *registered})


def _compose(overrides: list[str], hydra: bool = False):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return compose(config_name="train", overrides=overrides, return_hydra_config=hydra)


def _values(overrides: list[str]) -> dict:
    """The task config as scripts/train.py receives it (hydra: interpolations resolved)."""
    cfg = _compose(overrides, hydra=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return OmegaConf.to_container(cfg, resolve=True)


def _run_config(overrides: list[str]) -> RunConfig:
    return RunConfig.from_dict(_values(overrides))


def _dirs(overrides: list[str]) -> tuple[str, str, str]:
    """(hydra.run.dir, hydra.sweep.dir, job 0's hydra.sweep.subdir) as scripts/train.py's Hydra has them."""
    cfg = _compose(overrides, hydra=True)
    HydraConfig.instance().set_config(cfg)
    with read_write(cfg.hydra.job), open_dict(cfg.hydra.job):
        cfg.hydra.job.num = 0
    return cfg.hydra.run.dir, cfg.hydra.sweep.dir, cfg.hydra.sweep.subdir


def test_the_registry_groups_are_the_registries_and_have_no_files():
    """One definition per option: the groups are read from the registries, never restated in YAML."""
    for group in ("model", "pos", "attention", "recipe", "task"):
        assert not (CONFIGS / group).exists(), group
    assert _options("model") == sorted(PRESETS)
    assert _options("pos") == sorted(encoding_options()) and set(REGISTRY) <= set(encoding_options())
    assert _options("attention") == sorted(ATTENTION_VARIANTS)
    assert _options("recipe") == sorted(RECIPES)
    assert _options("task") == sorted(TASKS)
    assert _names("logger") == ["console", "none", "wandb"]
    assert "debug" in _names("experiment")


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_model_option_equals_its_preset(name):
    assert _run_config([f"model={name}", "recipe=adamw_baseline"]).model == preset(name)
    # The default recipe sets its model fields and changes nothing else.
    default = dataclasses.replace(preset(name), **RECIPES["default"]["model"])
    assert _run_config([f"model={name}"]).model == default


@pytest.mark.parametrize("pos", sorted(encoding_options()))
@pytest.mark.parametrize("model", ["gpt-tiny", "llama-tiny", "llama-small"])
def test_each_pos_composes_with_each_cpu_model(model, pos):
    """The option sets its own fields (pos, and a named form's: rope_fraction, a layout ...) and no other."""
    own = encoding_options()[pos]
    run = _run_config([f"model={model}", f"pos={pos}"]).model.to_dict()
    assert {k: run[k] for k in own} == own and run["rope_scaling"] is None
    base = _preset_model(model)
    assert {k: v for k, v in run.items() if k not in own} == {k: v for k, v in base.items() if k not in own}


@functools.cache
def _preset_model(model: str) -> dict:
    """The model section a preset composes to with no pos: composed once per preset for the cases above."""
    return _run_config([f"model={model}"]).model.to_dict()


@pytest.mark.parametrize("variant", sorted(ATTENTION_VARIANTS))
def test_each_attention_variant_sets_its_fields_on_the_attention_labs_model(variant):
    run = _run_config(["experiment=attention", f"attention={variant}"]).model
    fields = {**ATTENTION_VARIANTS[variant]}
    if fields.get("n_kv_head", 0) is None:  # null: as many key/value heads as query heads
        fields["n_kv_head"] = run.n_head
    assert {k: getattr(run, k) for k in fields} == fields


def test_without_pos_a_preset_keeps_its_own_encoding():
    assert _run_config(["model=gpt2-small"]).model.pos == "learned"
    assert _run_config(["model=llama-tiny"]).model.pos == "rope"


def test_the_adamw_baseline_is_the_dataclass_defaults_with_llama_tiny():
    run = _run_config(["recipe=adamw_baseline"])
    assert run.train == TrainConfig() and run.logger == LoggerConfig()
    assert run.model == preset("llama-tiny") and run.data.name == "shakespeare"
    assert run.out_dir.startswith("runs/")
    assert run.out_dir.endswith(f"-{os.getpid()}")  # two runs started in the same second cannot collide


@pytest.mark.parametrize("logger", _names("logger"))
def test_each_logger_composes(logger):
    assert _run_config([f"logger={logger}"]).logger.type == logger


@pytest.mark.parametrize("experiment", _names("experiment"))
def test_each_experiment_composes(experiment):
    chosen = ["task=copy"] if experiment == "tasks" else []  # its runs are named after their task
    values = _values([f"experiment={experiment}", "pos=rope", *chosen])
    values["train"]["init_from"] = None  # a fine-tune recipe's checkpoint need not exist here
    RunConfig.from_dict(values)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_each_recipe_sets_its_fields_over_the_default_run(name):
    cfg = _run_config([f"recipe={name}"])
    for section, fields in RECIPES[name].items():
        assert {k: getattr(getattr(cfg, section), k) for k in fields} == fields


def test_the_default_run_is_the_default_recipe_everywhere_it_is_used():
    def run(config: RunConfig) -> RunConfig:
        return dataclasses.replace(config, out_dir="x")  # the run directory is the one key that differs

    default = run(_run_config([]))
    bench = BenchConfig()
    assert list(bench.speedrun_candidate) == list(bench.train_recipe) == as_overrides(RECIPES["default"])
    assert default == run(recipe(bench.train_recipe))
    assert run(_run_config(["recipe=adamw_baseline"])) == run(recipe([]))


@pytest.mark.parametrize("experiment", ["extrapolation", "attention", "passkey", "pos_sweep"])
def test_the_position_labs_train_the_labs_recipe(experiment):
    """Token shift is a position signal of its own; the labs measure each encoding alone."""
    lab = _values([f"experiment={experiment}", "pos=rope"])
    assert lab["model"]["token_shift"] is False and _values([])["model"]["token_shift"] is True
    fields = RECIPES["labs"]["train"]
    if experiment == "passkey":  # its fine-tune keeps its own rate
        fields = {k: v for k, v in fields.items() if k != "lr"}
    assert {k: lab["train"][k] for k in fields} == fields
    # A row of the attention lab, and a user's override, still switch it on.
    assert _values(["experiment=attention", "attention=token_shift"])["model"]["token_shift"] is True
    assert _values([f"experiment={experiment}", "pos=rope", "model.token_shift=true"])["model"]["token_shift"]


@pytest.mark.parametrize("task", sorted(TASKS))
def test_each_task_composes_into_the_task_suites_run(task):
    cfg = _run_config(["experiment=tasks", f"task={task}", "pos=nope"])
    assert cfg.task.name == task and cfg.data.tokenizer.type == "byte" and cfg.train.seq_len is None
    assert (cfg.task.train_length, cfg.task.curriculum_steps) == (TASKS[task].train_length,
                                                                  TASKS[task].curriculum_steps)
    assert _dirs(["experiment=tasks", f"task={task}", "pos=nope"]) == (
        f"runs/tasks/{task}/nope", "runs/tasks", f"{task}/nope")  # a sweep's root is out_dir too
    # The suite keeps its own optimizer keys (docs/tasks.md measured them), not the default recipe's.
    assert (cfg.train.optimizer, cfg.train.lr, cfg.train.schedule, cfg.model.tie_embeddings,
            cfg.train.head_lr_scale) == ("muon", 0.001, "cosine", True, 1.0)
    # The rate does not depend on the budget: a run that learns stops where the calibration's did.
    assert cfg.train.decay_steps is not None
    # A run ends once it has learned its task past the bar the lab judges it by, so a status is no coin flip.
    assert LEARNED < cfg.train.stop_at_accuracy < 1


@pytest.mark.parametrize("lab", sorted(LAB_JOBS))
def test_the_bench_times_each_labs_own_job(lab):
    """The bench's labs section trains LAB_JOBS[lab] for the lab: a run of the lab's experiment."""
    experiment, *row = LAB_JOBS[lab]
    assert experiment == f"experiment={lab}"
    assert _run_config([*LAB_JOBS[lab], "train.compile=true"]).train.compile is True
    assert _dirs(list(LAB_JOBS[lab]))[0].startswith(f"runs/{lab}/")


def test_a_lab_compiles_its_jobs_where_the_bench_measured_that_it_pays():
    """docs/results/bench.md's labs section: a lab's jobs compile (train.compile=auto) when both of its
    compiled modes (the compile cache as found, then warm) took less wall time than the eager jobs,
    each mode by the median of its jobs."""
    rows = json.loads((REPO / "docs" / "results" / "bench.json").read_text())["sections"]["labs"]
    for lab, job in LAB_JOBS.items():
        pays = min(r["vs_eager"] for r in rows if r["lab"] == lab and r["mode"].startswith("compiled")) > 1
        assert _run_config(list(job)).train.compile == ("auto" if pays else False), lab


def test_the_task_labs_budget_is_its_calibrations():
    """configs/experiment/tasks.yaml's train.max_steps is the one docs/results/task_budget.md gives."""
    page = json.loads((REPO / "docs" / "results" / "task_budget.json").read_text())
    learned = [max(row["values"]["steps"]) for row in page["rows"] if row["status"] is None]
    assert _run_config(["experiment=tasks", "task=copy"]).train.max_steps == BUDGET_FACTOR * max(learned)


def test_the_addition_calibration_is_lee_et_als_run():
    """Lee et al. 2023's config2/addition/reverse/train_addition_bal.py on NanoGPT's block: 12 d^2
    weights a layer (no biases) and the LayerNorm gains, beside the token and position tables."""
    cfg = _run_config(["experiment=addition_calibration", "task=addition", "pos=learned"])
    assert (cfg.task.name, cfg.task.train_length, cfg.task.reversed_answer, cfg.task.train_examples) == (
        "addition", 3, True, 10_000)
    assert (cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model, cfg.model.dropout, cfg.model.pos) == (
        6, 6, 384, 0.2, "learned")
    t = cfg.train
    assert (t.optimizer, t.lr, t.beta2, t.batch_size, t.max_steps, t.warmup_steps, t.schedule) == (
        "adamw", 0.001, 0.99, 256, 5000, 100, "cosine")
    with torch.device("meta"):
        blocks = GPT(cfg.model).num_params(exclude_embeddings=True) - 16 * 384  # less the position table
    assert blocks == 6 * (12 * 384**2 + 2 * 384) + 384


def test_debug_shrinks_everything():
    run = _run_config(["experiment=debug"])
    assert run.model.d_model <= 64 and run.train.max_steps <= 50 and run.seq_len <= 64


def test_overrides_reach_the_dataclasses():
    run = _run_config(["model=llama-tiny", "pos=alibi", "model.n_kv_head=1", "train.max_steps=2000",
                       "train.schedule=wsd", "data.corpus=text", "data.paths=[a.txt]",
                       "data.tokenizer.type=byte"])
    assert (run.model.pos, run.model.n_kv_head) == ("alibi", 1)
    assert (run.train.max_steps, run.train.schedule) == (2000, "wsd")
    assert (run.data.corpus, run.data.paths, run.data.tokenizer.type) == ("text", ["a.txt"], "byte")


def test_min_lr_and_n_kv_head_stay_derived_when_their_sources_change():
    run = _run_config(["train.lr=0.01", "model=gpt2-small"])
    assert run.train.min_lr == pytest.approx(0.001) and run.model.n_kv_head == 12


def test_hydra_never_changes_directory_and_sweeps_into_subdirectories_named_by_their_values():
    hydra = _compose(["out_dir=runs/x"], hydra=True).hydra
    assert hydra.job.chdir is False and hydra.output_subdir is None
    assert hydra.run.dir == "runs/x" and hydra.sweep.dir == "runs/x"
    assert OmegaConf.to_container(hydra.sweep)["subdir"] == "${sweep_job_name:${hydra.job.num}}"
    sweep = _compose(["experiment=pos_sweep"], hydra=True).hydra.sweeper.params
    assert sweep.pos == "sinusoidal,learned,rope,alibi,nope"


@pytest.mark.parametrize(("overrides", "dirs"), [
    (["experiment=extrapolation"], ("runs/extrapolation/rope", "runs/extrapolation", "rope")),  # llama-tiny's
    (["experiment=extrapolation", "model=gpt-tiny"], ("runs/extrapolation/learned", "runs/extrapolation",
                                                      "learned")),
    (["experiment=extrapolation", "model.pos=[rope,nope]"], ("runs/extrapolation/rope-nope",
                                                             "runs/extrapolation", "rope-nope")),
    (["experiment=passkey", "out_dir=runs/p"], ("runs/p/rope", "runs/p", "rope")),
    (["experiment=attention", "out_dir=runs/a"], ("runs/a/plain", "runs/a", "plain")),
    (["experiment=tasks", "task=copy", "out_dir=runs/t"], ("runs/t/copy/rope", "runs/t", "copy/rope")),
    (["experiment=recipe_sweep", "out_dir=runs/r"], ("runs/r/default/seed0", "runs/r", "default/seed0")),
], ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_experiments_put_every_run_below_out_dir_named_never_none(overrides, dirs):
    """A sweep's root is out_dir, as a single run's is; without pos= the preset's own encoding names it."""
    assert _dirs(overrides) == dirs
    if overrides[0] == "experiment=passkey":
        assert _values(overrides)["train"]["init_from"] == "runs/extrapolation/rope"


@pytest.mark.parametrize(("overrides", "message"), [
    (["out_dir="], "out_dir='' is invalid: an empty path; give a folder path"),
    (["experiment=extrapolation", "out_dir="], "out_dir='' is invalid: an empty path"),  # not /rope
    (["out_dir=."], f"out_dir='.' is invalid: it is the root of the repository {REPO}; "),
    (["experiment=tasks"], "a run directory named 'None/rope' has an unnamed part: give the choice this "
                           "experiment names its runs by (task=<name>)"),
], ids=["empty", "empty-experiment", "repository", "tasks-without-task"])
def test_a_run_directory_that_is_empty_the_repository_or_unnamed_is_refused_before_hydra_makes_it(
        overrides, message, monkeypatch):
    monkeypatch.chdir(REPO)
    with pytest.raises(Exception) as info:
        _dirs(overrides)
    assert one_line(info.value).startswith(message), one_line(info.value)


def _choices_checked(overrides: list[str]) -> None:
    """What scripts/train.py checks of a composed run before it starts (check_choices)."""
    check_choices(_compose(overrides, hydra=True).hydra)


@pytest.mark.parametrize(("overrides", "conflicts"), [
    (["experiment=tasks", "task=copy", "recipe=adamw_baseline"],
     ["train.optimizer='muon' (the recipe: 'adamw')"]),
    (["experiment=tasks", "task=copy", "recipe=labs"], ["train.lr=0.001 (the recipe: 0.006)"]),
    (["experiment=passkey", "pos=rope", "recipe=default"],
     ["train.lr=0.001 (the recipe: 0.01)", "train.max_steps=1200 (the recipe: 1700)"]),
    (["experiment=debug", "recipe=default"],
     ["train.max_steps=20 (the recipe: 1700)", "train.warmup_steps=2 (the recipe: 50)",
      "train.compile=False (the recipe: 'auto')"]),
])
def test_a_recipe_an_experiment_would_override_is_refused_naming_both(overrides, conflicts):
    """The experiment's keys come after the recipe's: a key both set would drop the recipe's value."""
    choice = dict(o.split("=") for o in overrides)
    refusal = (f"recipe={choice['recipe']} is invalid with experiment={choice['experiment']}: the experiment "
               f"sets {', '.join(conflicts)}; set each on the command line to choose, or drop recipe=")
    with pytest.raises(ValueError, match=re.escape(refusal)):
        _choices_checked(overrides)


@pytest.mark.parametrize("overrides", [
    ["experiment=tasks", "task=copy"],  # the experiment's own choice (recipe: null) and keys
    ["experiment=passkey", "pos=rope"],  # its own recipe (labs) with its own rate: the experiment's choice
    ["experiment=debug", "recipe=labs"],  # labs sets nothing debug sets: applied whole
    ["experiment=extrapolation", "pos=rope", "recipe=adamw_baseline"],  # replaces the experiment's labs
    ["experiment=debug", "recipe=default", "train.max_steps=20", "train.warmup_steps=2",
     "train.compile=false"],  # the user's keys
    ["recipe=adamw_baseline"],  # no experiment
])
def test_a_recipe_is_applied_whole_when_nothing_overrides_it(overrides):
    _choices_checked(overrides)
    choice = dict(o.split("=") for o in overrides)
    if "recipe" in choice:  # every key of the recipe's, but those the command line sets itself
        run = _run_config(overrides)
        for section, fields in RECIPES[choice["recipe"]].items():
            applied = {k: v for k, v in fields.items() if f"{section}.{k}" not in choice}
            assert {k: getattr(getattr(run, section), k) for k in applied} == applied


def test_a_recipe_swept_with_an_experiment_is_checked_per_job():
    """A sweep's recipe (experiment=recipe_sweep's own) reaches each job as a command-line choice."""
    _choices_checked(["experiment=recipe_sweep", "recipe=labs"])
    with pytest.raises(ValueError, match="recipe=default is invalid with experiment=debug"):
        _choices_checked(["experiment=debug", "recipe=default"])
