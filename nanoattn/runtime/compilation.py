"""Compilation (``true | false | auto``): whether ``torch.compile`` can run here, and where its kernels go.

``torch.compile`` needs Inductor's compiler: a C++ compiler and Python's headers for a CPU (``$CXX``,
else g++), Triton for a CUDA GPU. ``auto`` compiles where it is there; ``true`` without it is refused
before anything runs, not at the first step. Compiled kernels are cached under ``cache_dir()`` (not
/tmp, which a reboot clears), so a shape is compiled once per machine.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sysconfig
from pathlib import Path

import torch

from nanoattn.runtime.process import cache_dir
from nanoattn.validation import fail


def compiler_missing(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot compile for ``device`` here (None: it can)."""
    if device.type == "cpu":
        compiler = os.environ.get("CXX", "g++")
        if not shutil.which(compiler):
            return f"no C++ compiler ({compiler}, or $CXX) for the CPU"
        headers = Path(sysconfig.get_path("include")) / "Python.h"  # Inductor's C++ kernels include it
        return None if headers.is_file() else f"no Python headers ({headers}) for Inductor's C++ kernels"
    if device.type == "cuda":
        return None if importlib.util.find_spec("triton") else "no Triton for the GPU"
    return None  # mps: Inductor writes Metal shaders, which the OS compiles


def check_compile_choice(owner: str, name: str, value: object) -> None:
    """true | false | auto (a bool, not 1 or 'true')."""
    if not (isinstance(value, bool) or value == "auto"):
        fail(owner, name, value, "allowed: true | false | auto")


def compile_choice(choice: bool | str, device: torch.device, key: str = "train.compile",
                   ) -> tuple[bool, str]:
    """(whether to torch.compile, why) for ``key``'s value (true | false | auto) on ``device``."""
    owner, _, name = key.rpartition(".")
    check_compile_choice(owner, name, choice)
    if choice is False:
        return False, f"eager ({key}=false)"
    missing = compiler_missing(device)
    if choice is True:
        if missing:
            raise ValueError(f"{key}=true is invalid here: {missing}; {key}=auto or false runs eagerly")
        return True, f"compiled ({key}=true)"
    if missing:
        return False, f"eager (auto: {missing})"
    return True, "compiled (auto: Inductor's compiler is here)"


def use_compile_cache() -> Path:
    """Point Inductor's cache at ``cache_dir()/torchinductor`` unless $TORCHINDUCTOR_CACHE_DIR names
    another folder than Inductor's default in /tmp; returns the folder. Call before compiling."""
    from torch._inductor.runtime.runtime_utils import default_cache_dir  # here: importing Inductor is slow

    # Importing Inductor writes its default into the variable, so only another value is the user's.
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given is None or os.path.abspath(given) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "torchinductor")
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def use_deterministic_compilation() -> None:
    """Compile with torch's deterministic algorithms, process-wide as its switch is. Inductor then calls
    the library's kernel for an index's backward pass (embedding lookups, bias tables) where it would
    emit atomic adds, whose order of summation changes with the threads' timing: a compiled run then
    repeats itself to the bit and resumes exactly, as an eager one does. An op with no deterministic
    kernel warns rather than fails, and new tensors are not filled with NaN (torch's debugging aid)."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
