"""``--help`` on every script: its own docstring (what it does, an example), the groups its config composes
and no other, and every key with its default; before, every script but train.py printed Hydra's generic
"_hydra_cli is powered by Hydra" and every group of configs/, used or not."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import _hydra_cli  # noqa: E402  (scripts/ is not a package)

SCRIPTS = sorted(p.stem for p in (REPO / "scripts").glob("*.py")
                 if not p.stem.startswith("_") and (REPO / "configs" / f"{p.stem}.yaml").is_file())


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_script_explains_itself(name):
    module = importlib.import_module(name)  # registers its schema (and a training script's groups)
    text = _hydra_cli.script_help(name, module.__doc__)
    assert text.startswith(module.__doc__.strip().splitlines()[0]) and "python scripts/" in text
    assert "\nKeys (key=value; --cfg job prints them as composed):\n" in text
    assert "powered by Hydra" not in text


def test_a_script_lists_only_the_groups_it_composes():
    importlib.import_module("extend_context")
    text = _hydra_cli.script_help("extend_context", importlib.import_module("extend_context").__doc__)
    assert "  data: " in text and "  pos: " not in text and "  attention: " not in text


def test_help_exits_cleanly_from_the_command_line():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "eval_length.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and not done.stderr
    assert done.stdout.startswith("Perplexity at several lengths")
