"""The two set-up commands on any Python >= 3.10: ``make train`` and ``make test`` install into a virtual
environment, the active one or else ``.venv`` made from PYTHON3, never into a system Python (which
Debian and Ubuntu refuse: PEP 668); ``make train`` installs what training needs, ``make test`` adds the
dev extra. Read from ``make -n -B`` (what make would run), nothing installed."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def planned(target: str, python3: Path) -> list[str]:
    done = subprocess.run(["make", "-n", "-B", "-C", str(REPO), target, f"PYTHON3={python3}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if not line.startswith("make")]


def test_a_python_outside_any_virtual_environment_gets_a_venv_of_its_own():
    system = Path(sys.base_prefix) / "bin" / "python3"  # the interpreter any virtual environment came from
    train = planned("train", system)
    assert train[0].startswith(f"{system} -m venv .venv")
    assert ".venv/bin/python -m pip install -e ." in train
    assert train[-1] == ".venv/bin/python scripts/train.py"
    assert not any(line.startswith(f"{system} -m pip") for line in train)  # the system Python: never written
    assert not any("[dev]" in line for line in train)  # training needs no dev extra
    test = planned("test", system)
    assert '.venv/bin/python -m pip install -e ".[dev]"' in test
    assert test[-3:] == [".venv/bin/lint-imports", ".venv/bin/python -m ruff check .",
                         ".venv/bin/python -m pytest"]


def test_an_active_virtual_environment_is_used_as_it_is(tmp_path):
    venv.create(tmp_path / "env", with_pip=False)
    python = tmp_path / "env" / "bin" / "python"
    train = planned("train", python)
    assert not any("-m venv" in line for line in train)
    assert f"{python} -m pip install -e ." in train and train[-1] == f"{python} scripts/train.py"


def test_gpu_check_without_a_cuda_device_says_so_in_one_line_and_exits_0():
    """``make gpu-check`` runs scripts/gpu_check.py in the environment ``make test`` sets up; here with
    no CUDA device visible, whatever this machine has (what the check does on a GPU: its docstring)."""
    assert planned("gpu-check", Path(sys.executable))[-1].endswith("scripts/gpu_check.py")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py")], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert done.stdout.startswith("gpu-check: no CUDA device visible to torch ")
    assert done.stdout.count("\n") == 1
