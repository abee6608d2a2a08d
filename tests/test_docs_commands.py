"""The documented commands do not rot: every ``python scripts/<name>.py ...`` (or ``torchrun ...
scripts/<name>.py``) line of a fenced bash block in README.md and docs/*.md composes with Hydra's
compose API (the script's config, the command's overrides; each value of a ``-m`` sweep), and a
training command passes the checks the script makes of its choices. ``eval_harness``, lm-eval's
command line, is parsed by lm-eval's own parser.

Then each one runs, in this process, in a scratch folder holding tiny forms of the runs the docs
name, but those ``why_not_run`` gives a reason for (a lab's or the bench's minutes, the network).

An argument holding ``[]{}*?`` must be quoted: bash globs it and passes it on only when no file
matches, and zsh refuses the command outright.
"""

from __future__ import annotations

import importlib
import re
import shlex
import shutil
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf
from test_one_line_errors import run_script

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from _hydra_cli import CONFIG_PATH, OPEN_MAPPINGS, check_choices  # noqa: E402  (scripts/ is not a package)

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPT = re.compile(r"(?:^|/)scripts/(\w+)\.py$")
GLOB = set("[]{}*?")
PLACEHOLDER = re.compile(r"<(\w+)>")


def documented_commands() -> list[tuple[str, str, list[str], list[str], str]]:
    """(where, script, its arguments as the shell passes them, as written, its launcher: python or
    torchrun) of every documented script command."""
    found = []
    for doc in DOCS:
        for block in re.finditer(r"^```bash\n(.*?)^```", doc.read_text(), re.S | re.M):
            first = doc.read_text()[:block.start()].count("\n") + 2
            text = block.group(1).replace("\\\n", " ")  # continuation lines join their command
            for offset, line in enumerate(text.splitlines()):
                lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
                lexer.whitespace_split, lexer.commenters = True, "#"
                raw = shlex.shlex(line, posix=False, punctuation_chars=";&|")
                raw.whitespace_split, raw.commenters = True, "#"
                for words, written in zip(_commands(list(lexer)), _commands(list(raw)), strict=True):
                    at = next((i for i, word in enumerate(words) if SCRIPT.search(word)), None)
                    if at is not None and words[0] in ("python", "torchrun"):
                        where = f"{doc.relative_to(REPO)}:{first + offset}"
                        found.append((where, SCRIPT.search(words[at])[1], words[at + 1:], written[at + 1:],
                                      words[0]))
    return found


def _unquoted(word: str) -> set[str]:
    """The characters of a word as written that no quote protects from the shell."""
    outside, quote = set(), None
    for char in word:
        if quote is None and char in "'\"":
            quote = char
        elif char == quote:
            quote = None
        elif quote is None:
            outside.add(char)
    return outside


def _commands(words: list[str]) -> list[list[str]]:
    """Words split into commands at ``;``, ``&&``, ``|`` and a loop's ``do``."""
    commands, current = [], []
    for word in words:
        if set(word) <= set(";&|") or word in ("do", "done", "then"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    return [*commands, current]


COMMANDS = documented_commands()


def test_the_docs_document_the_commands():
    scripts = {script for _, script, *_ in COMMANDS}
    assert len(COMMANDS) > 50 and {"train", "sample", "eval_length", "extend_context", "bench"} <= scripts


def _overrides(arguments: list[str]) -> list[list[str]]:
    """The override lists a command composes: flags dropped, one list per value of each sweep."""
    kept, skip = [], False
    for argument in arguments:
        if skip or argument in ("-m", "--multirun"):
            skip = False
            continue
        if argument.startswith("--"):
            skip = argument in ("--cfg", "-c", "--package", "-p")
            continue
        argument = PLACEHOLDER.sub(r"\1", argument)  # runs/<run>: a name the reader chooses
        kept.append("+" + argument if argument.startswith(OPEN_MAPPINGS) else argument)
    parsed = OverridesParser.create().parse_overrides(kept)
    sweeps = [i for i, override in enumerate(parsed) if override.is_sweep_override()]
    if not sweeps:
        return [kept]
    def assign(j: int, value: str) -> str:
        return f"{parsed[j].get_key_element()}={value}"

    first = {j: assign(j, next(parsed[j].sweep_string_iterator())) for j in sweeps}
    runs = []
    for i in sweeps:  # each value of each sweep, the other sweeps at their first value
        for value in parsed[i].sweep_string_iterator():
            chosen = {**first, i: assign(i, value)}
            runs.append([chosen.get(j, override) for j, override in enumerate(kept)])
    return runs


def why_not_run(script: str, arguments: list[str], launcher: str) -> str | None:
    """Why the suite does not run a documented command (None: it runs). The one place that says so."""
    if launcher == "torchrun":
        return "two processes train the default model (DDP); tests/train/test_cli.py trains DDP tiny"
    if script.endswith("_lab"):
        return ("a lab trains its rows for minutes, even with quick=true; tests/train/test_lab_training.py "
                "trains each lab at a tiny size")
    if script == "bench" and "--cfg" not in arguments:
        return "the bench times this machine for minutes; tests/test_bench.py runs each section tiny"
    if any("$" in argument for argument in arguments):
        return "a line of a shell loop: the loop around it sets its $variables"
    if "data=hf" in arguments or "hellaswag" in arguments:
        return "it downloads a dataset from the Hugging Face Hub, which the suite does not reach"
    if script == "eval_harness":
        return "a task folder of the reader's; tests/eval/test_harness.py runs it on a task it writes"
    if script == "prepare_data" and "data=text" not in arguments:
        return ("it tokenizes all of Shakespeare, as make train does first; tests/data/test_data_corpora.py "
                "reads that corpus")
    return None


RUN = [command for command in COMMANDS if why_not_run(*command[1:3], command[4]) is None]
NOT_RUN = [command for command in COMMANDS if command not in RUN]


def test_every_documented_argument_that_the_shell_globs_is_quoted():
    unquoted = [(where, word) for where, _, _, written, _ in COMMANDS for word in written
                if _unquoted(word) & GLOB]
    assert not unquoted, f"quote these (bash globs them; zsh refuses them): {unquoted}"


@pytest.mark.parametrize(("where", "script", "arguments", "written", "launcher"), NOT_RUN,
                         ids=[c[0] for c in NOT_RUN])
def test_each_documented_command_not_run_composes(where, script, arguments, written, launcher, monkeypatch):
    """What the suite can check of a command it does not run (running one composes it, and more)."""
    if script == "eval_harness":
        from lm_eval._cli import HarnessCLI

        monkeypatch.setattr(sys, "argv", [script, *(PLACEHOLDER.sub(r"\1", a) for a in arguments)])
        parsed = HarnessCLI().parse_args()  # exits with its usage on an option it does not know
        assert parsed.model == "nanoattn" and parsed.tasks, where
        return
    importlib.import_module(script)  # registers the script's schema (and the registries' groups)
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            for overrides in _overrides(arguments):
                cfg = compose(config_name=script, overrides=overrides, return_hydra_config=script == "train")
                if script == "train":
                    check_choices(cfg.hydra)
    finally:
        GlobalHydra.instance().clear()


# An override quoted inline in prose, `'key=value'`, as a reader copies it onto a command line.
INLINE_OVERRIDE = re.compile(r"`'([\w.+~]+=[^`']*)'`")


def test_every_override_quoted_in_the_prose_parses():
    """`'train_overrides=[train.max_steps=1000]'` was documented and Hydra refuses it (a list element
    holding '=' must be quoted); the overrides a lab hands on must each be key=value too."""
    quoted = [(doc.name, match[1]) for doc in DOCS for match in INLINE_OVERRIDE.finditer(doc.read_text())]
    assert len(quoted) > 5
    parser = OverridesParser.create()
    for where, override in quoted:
        parsed = parser.parse_override(override)
        if parsed.get_key_element().endswith("_overrides"):
            assert all("=" in str(element) for element in parsed.value()), (where, override)


# A training command's size, at most: a model as narrow as its heads allow, for two steps; a language
# model also as short as the workspace's runs, over the bytes of its corpus. A number the command gives
# is capped (a wrong one, -5 steps, still fails); its other values are its own.
TINY_TRAINING = {"model.d_model": "48", "model.d_ff": "96", "train.max_steps": "2", "train.batch_size": "2",
                 "train.warmup_steps": "1", "train.eval_interval": "2", "train.eval_steps": "1",
                 "train.compile": "false", "logger": "none"}
TINY_LANGUAGE_MODEL = {"model.max_seq_len": "64", "model.vocab_size": "257"}
TRAINING_SCRIPTS = ("train", "extend_context")
# The size of what a command that reads a run does, at most.
TINY_READING = {"sample": {"max_new_tokens": "16"}, "eval_task": {"per_bin": "32"},
                "eval_passkey": {"samples": "4"}}


def composed(script: str, arguments: list[str]) -> DictConfig:
    """The config a command composes (a sweep's first job)."""
    importlib.import_module(script)  # registers the script's schema
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
            return compose(config_name=script, overrides=_overrides(arguments)[0])
    finally:
        GlobalHydra.instance().clear()


def tiny_training(script: str, arguments: list[str], corpus: dict[str, str],
                  cfg: DictConfig | None = None) -> list[str]:
    """``arguments`` within TINY_TRAINING (``capped``), on the corpus where the command names no
    data; a model read from a checkpoint keeps its shape. ``cfg``: what the command composes, if known."""
    given = {argument.lstrip("+~").split("=", 1)[0] for argument in arguments}
    cfg = composed(script, arguments) if cfg is None else cfg
    keys = {**TINY_TRAINING, **(TINY_LANGUAGE_MODEL if cfg.task.name is None else {})}
    # Unresolved: an experiment's init_from may interpolate Hydra's runtime, which is not set here.
    if script == "extend_context" or OmegaConf.to_container(cfg.train)["init_from"]:
        keys = {key: value for key, value in keys.items() if not key.startswith("model.")}
    if not any(key == "data" or key.startswith("data.") for key in given):
        keys.update(corpus)
    return capped(arguments, keys)


def capped(arguments: list[str], values: dict[str, str]) -> list[str]:
    """``arguments`` with each of ``values`` added where the command gives no value of its own, and
    taken where both are integers and it is the smaller."""
    def key(argument: str) -> str:
        return argument.lstrip("+~").split("=", 1)[0]

    given = {key(argument): argument.split("=", 1)[1] for argument in arguments if "=" in argument}
    smaller = {k: v for k, v in values.items() if k not in given
               or (given[k].isdigit() and v.isdigit() and int(v) < int(given[k]))}
    return [*(argument for argument in arguments if key(argument) not in smaller),
            *(f"{k}={v}" for k, v in smaller.items())]


def one_step(arguments: Iterable[str]) -> list[str]:
    """A training command's arguments for a run killed after its first step."""
    return [*(a for a in arguments if not a.startswith("train.max_steps=")), "train.max_steps=1"]


@pytest.fixture(scope="session")
def workspace(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A folder as the docs' reader has it, the runs they name trained tiny (``TINY_TRAINING``) on a
    byte-tokenized corpus, with the files they read; and that corpus's data overrides."""
    root = tmp_path_factory.mktemp("docs_workspace")
    corpus_dir = root.parent / f"{root.name}_corpus"
    corpus_dir.mkdir()
    (corpus_dir / "text.txt").write_text("".join(f"line {i}: to be or not to be, that is the question.\n"
                                                 for i in range(400)))
    corpus = {"data": "text", "data.name": "docs", "data.paths": f"[{corpus_dir / 'text.txt'}]",
              "data.root": str(corpus_dir / "prepared"), "data.tokenizer.type": "byte"}
    (root / "notes").mkdir()  # the reader's own text: the docs, enough for a BPE of the default size
    for doc in DOCS[1:]:
        shutil.copy(doc, root / "notes")
    shutil.copy(DOCS[0], root / "book.txt")
    (root / "prompt.txt").write_text("ROMEO:")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.chdir(root)
        for script, arguments in (
                ("train", one_step(tiny_training("train", ["out_dir=runs/x"], corpus))),  # killed at step 1
                ("train", tiny_training("train", ["out_dir=runs/run", "model.token_shift=false"], corpus)),
                ("train", tiny_training("train", ["experiment=tasks", "task=copy", "pos=rope",
                                                  "out_dir=runs/tasks"], corpus)),
                ("eval_length", ["ckpt=runs/run"]),
                ("eval_length", ["ckpt=runs/run", "rope_scaling={type:yarn,factor:4}"])):
            assert run_script(monkeypatch, script, *arguments) is None, (script, arguments)
        for name in ("a", "b", "base", "llama-tiny", "ctx_base/rope", "extrapolation/rope", "passkey/rope"):
            shutil.copytree(root / "runs" / "run", root / "runs" / name)
    return root, corpus


@pytest.mark.parametrize(("where", "script", "arguments", "written", "launcher"), RUN,
                         ids=[c[0] for c in RUN])
def test_each_documented_command_runs(where, script, arguments, written, launcher, workspace, tmp_path,
                                      monkeypatch):
    """As written, in a copy of the workspace (``runs/<run>`` is its ``runs/run``), at the sizes of
    ``TINY_TRAINING`` and ``TINY_READING``. A command that resumes a run the workspace lacks trains
    that run a step first, as the docs' command before it did."""
    root, corpus = workspace
    arguments = [PLACEHOLDER.sub(r"\1", argument) for argument in arguments]
    shutil.copytree(root, tmp_path / "w")
    monkeypatch.chdir(tmp_path / "w")
    if script in TRAINING_SCRIPTS:
        cfg = composed(script, arguments)
        arguments, trains_into = tiny_training(script, arguments, corpus, cfg), Path(cfg.out_dir)
        if "train.resume=true" not in arguments:  # the runs it makes are its own, not the workspace's
            shutil.rmtree(trains_into, ignore_errors=True)
        elif not trains_into.exists():
            killed = one_step(argument for argument in arguments if argument != "train.resume=true")
            assert run_script(monkeypatch, script, *killed) is None, where
    else:
        arguments = capped(arguments, TINY_READING.get(script, {}))
    started = time.time()
    assert run_script(monkeypatch, script, *arguments) is None, where
    if script in TRAINING_SCRIPTS:  # it trained (its out_dir may hold a time: not known in advance)
        assert any(path.stat().st_mtime >= started for path in Path().rglob("metrics.jsonl")), where
