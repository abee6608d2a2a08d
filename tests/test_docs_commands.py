"""The documented commands do not rot: every ``python scripts/<name>.py ...`` (or ``torchrun ...
scripts/<name>.py``) line of a fenced bash block in README.md and docs/*.md composes with Hydra's
compose API (the script's config, the command's overrides; each value of a ``-m`` sweep), and a
training command passes the checks the script makes of its choices. ``eval_harness``, lm-eval's
command line, is parsed by lm-eval's own parser. Nothing is run.

An argument holding ``[]{}*?`` must be quoted: bash globs it and passes it on only when no file
matches, and zsh refuses the command outright.
"""

from __future__ import annotations

import importlib
import re
import shlex
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
from _hydra_cli import CONFIG_PATH, OPEN_MAPPINGS, check_choices  # noqa: E402  (scripts/ is not a package)

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SCRIPT = re.compile(r"(?:^|/)scripts/(\w+)\.py$")
GLOB = set("[]{}*?")
PLACEHOLDER = re.compile(r"<(\w+)>")


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """(where, script, its arguments as the shell passes them) of every documented script command."""
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
                        found.append((where, SCRIPT.search(words[at])[1], words[at + 1:], written[at + 1:]))
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
    scripts = {script for _, script, _, _ in COMMANDS}
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


@pytest.mark.parametrize(("where", "script", "arguments", "written"), COMMANDS, ids=[c[0] for c in COMMANDS])
def test_each_documented_command_composes(where, script, arguments, written, monkeypatch):
    unquoted = [word for word in written if _unquoted(word) & GLOB]
    assert not unquoted, f"{where}: quote {unquoted} (bash globs it; zsh refuses it)"
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
