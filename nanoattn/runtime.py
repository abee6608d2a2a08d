"""Runtime policy every entry point shares: device choice, the autocast dtype, atomic writes, outputs.

- One device vocabulary (``auto | cpu | cuda | mps``; ``cuda:1`` too) and one rule for ``auto``:
  cuda, else mps, else cpu. An explicit device must exist.
- One dtype vocabulary (``auto | float32 | bfloat16 | float16``). Weights stay float32; any
  other dtype is autocast. ``auto`` takes bfloat16 where the hardware computes it natively:
  a CUDA GPU that supports it, or a CPU with AMX (``amx_bf16``) or AVX512-BF16
  (``avx512_bf16``) read from /proc/cpuinfo. Elsewhere bf16 is emulated and slower than float32.
- Compilation (``true | false | auto``): ``torch.compile`` needs Inductor's compiler, a C++
  compiler and Python's headers for a CPU (``$CXX``, else g++), Triton for a CUDA GPU. ``auto``
  compiles where it is there; ``true`` without it is refused before anything runs, not at the
  first step. Compiled kernels are cached under ``cache_dir()`` (not /tmp, which a reboot
  clears), so a shape is compiled once per machine.
- Atomic writes: a file is written beside its target under a dot-name and renamed over it, so a
  reader (or a kill at any instant) sees the old content or the new, never a torn file.
- Memory: ``keep_freed_memory`` makes glibc's malloc serve blocks below 32 MiB from its heap
  and keep up to 1 GiB of freed heap, so a training step's activations reuse the last step's
  pages instead of faulting fresh ones in (what CUDA's caching allocator does on a GPU). Every
  script calls it first; a program that calls the library directly can call it too.
- Locks: ``exclusive_lock`` holds an advisory ``flock`` on a lock file for as long as a block
  runs. The OS releases it when the process dies, however it dies, so a SIGKILLed run never
  leaves a stale lock; the file holds the holder's PID only to name it in the refusal.
- Outputs: every path a command writes passes ``check_output`` first, one rule for all of them:
  never an empty path, never a repository's root as a folder to fill, never inside a checkpoint
  (pruning deletes it; a model folder holds a model's files only), and an existing file is
  replaced only when the command recognises it, by name and format, as its own earlier output.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import importlib.util
import json
import os
import platform
import shutil
import sys
import sysconfig
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from nanoattn.validation import fail

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
# mallopt's parameters (glibc's malloc.h) and the largest mmap threshold it takes on 64-bit.
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD_MAX = 32 * 2**20
CHECKPOINTS = "checkpoints"  # <run dir>/checkpoints/<name>/ (nanoattn.checkpoint's layout)
MODEL_WEIGHTS = "model.safetensors"  # in every checkpoint and every transformers model folder
RUN_CONFIG = "config.yaml"  # <run dir>/config.yaml: a run directory's mark
CHECKOUT = Path(__file__).resolve().parents[1]  # the folder holding this package: its repository


def note(text: str) -> None:
    """Print one line to stderr above any progress bar."""
    tqdm.write(text, file=sys.stderr)


def check_device_name(owner: str, name: str, value: object) -> None:
    """A device string: one of DEVICES, or cuda:<index>."""
    if isinstance(value, str) and (value in DEVICES or (value.startswith("cuda:") and value[5:].isdigit())):
        return
    fail(owner, name, value, "allowed: " + " | ".join(DEVICES) + " | cuda:<index>")


def pick_device(name: str, key: str = "device") -> torch.device:
    """auto: cuda, else mps, else cpu; an explicit device must be available (``key`` names the option)."""
    available = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if name == "auto":
        name = next(n for n in ("cuda", "mps", "cpu") if available[n])
    kind = name.partition(":")[0]
    if kind not in available:
        raise ValueError(f"{key}={name!r} is invalid: allowed: " + " | ".join(DEVICES) + " | cuda:<index>")
    if not available[kind]:
        raise ValueError(f"{key}={name!r} is invalid: no {kind} device on this machine; allowed: "
                         + " | ".join(["auto"] + [n for n, ok in available.items() if ok]))
    return torch.device(name)


def _cpuinfo(field: str) -> str:
    """The first value of ``field`` in /proc/cpuinfo ('' where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.partition(":")[2].strip() for ln in f if ln.startswith(field)), "")
    except OSError:
        return ""


def cpu_flags() -> set[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where it does not exist)."""
    return set(_cpuinfo("flags").split())


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo, else the platform's processor, else 'unknown'."""
    return _cpuinfo("model name") or platform.processor() or "unknown"


def autocast_dtype(dtype: str, device: torch.device) -> tuple[torch.dtype | None, str]:
    """(the autocast dtype, or None for plain float32; why) for a dtype name on ``device``."""
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is invalid: allowed: " + " | ".join(DTYPES))
        if dtype == "float32":
            return None, "float32 (dtype=float32)"
        return getattr(torch, dtype), f"{dtype} autocast (dtype={dtype})"
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16, "bfloat16 autocast (auto: the GPU supports bf16)"
    if device.type == "cpu":
        fast = sorted(cpu_flags() & {"amx_bf16", "avx512_bf16"})
        if fast:
            return torch.bfloat16, f"bfloat16 autocast (auto: the CPU has {' and '.join(fast)})"
    return None, f"float32 (auto: no fast bf16 on this {device.type})"


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


def cache_dir() -> Path:
    """Downloaded corpora and compiled kernels: ``$NANOATTN_CACHE`` or ``~/.cache/nanoattn``."""
    return Path(os.environ.get("NANOATTN_CACHE") or "~/.cache/nanoattn").expanduser()


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


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The autocast context for ``dtype`` (None: float32, with any enclosing autocast switched off)."""
    if dtype is None or dtype == torch.float32:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def keep_freed_memory() -> bool:
    """Keep freed heap memory in the process for reuse; False where the C library is not glibc.

    By default glibc maps large blocks on malloc and unmaps them on free, and trims freed memory
    at the heap's top back to the OS, so every training step page-faults its activation tensors
    in again, each page zeroed by the kernel. Measured on the default run's step (one thread,
    AMD EPYC): 385k page faults and 153 ms a step by default, 87k and 131 ms with both thresholds
    raised. Blocks of 32 MiB and more are still mapped.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL("libc.so.6")
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and libc.mallopt(M_TRIM_THRESHOLD, 2**30))


def memory_bytes(device: torch.device) -> int:
    """The memory a tensor on ``device`` can use: the GPU's, else the machine's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_fits(nbytes: int, device: torch.device, what: str, *, key: tuple[str, str, Any] | None = None,
               advice: str | None = None, at_least: bool = False) -> None:
    """Refuse, before allocating, ``what`` when its ``nbytes`` exceed the device's memory.

    The one size check of every entry point. The error is one line: with ``key`` (owner, name,
    value) it names the option that asked for the size (``owner.name=value is invalid: ...``),
    and ``advice`` is appended when given. ``at_least``: ``nbytes`` is a lower bound.
    """
    have = memory_bytes(device)
    if nbytes <= have:
        return
    needs = f"needs {'at least ' if at_least else ''}{_gib(nbytes)} GiB"
    reason = (f"{what} {needs}, more than the {_gib(have)} GiB of {device}"
              + (f"; {advice}" if advice else ""))
    if key is not None:
        fail(*key, reason)
    raise ValueError(reason)


def affordable(unit_bytes: int, device: torch.device) -> int:
    """How many items of ``unit_bytes`` each the device's memory holds: a bound to read up to before
    anything is allocated (a prompt file's bytes, say)."""
    return memory_bytes(device) // unit_bytes


def _gib(nbytes: int) -> str:
    """Bytes as GiB with thousands separators; a size past float's range (a length from a huge
    multiple) reads inf rather than overflowing."""
    return f"{nbytes / 2**30 if nbytes < 2**1000 else float('inf'):,.1f}"


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so a timer or memory reading sees it finished."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def temporary_sibling(path: Path, tag: str = "tmp") -> Path:
    """A dot-name beside ``path``, unique to this process: readers skip it, cleaners recognise it."""
    return path.with_name(f".{path.name}.{tag}{os.getpid()}")


def fsync_dir(path: Path) -> None:
    """Make the renames inside ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary sibling and a rename; durable once it returns."""
    path = Path(path)
    tmp = temporary_sibling(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    fsync_dir(path.parent)
    return path


class LockedError(OSError):
    """Another process holds the lock (the message names it)."""


HOLDER_FILE = ".lock"  # inside a locked directory: the holder's PID, for the refusal's message only


@contextlib.contextmanager
def exclusive_lock(directory: str | Path, what: str, *, wait: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (created if missing) while the block runs.

    The lock is the directory's own inode, so no lock file ever has to be deleted (unlinking a
    lock file races with a process that has just opened it). ``what`` names the guarded thing in
    the refusal. Without ``wait`` a held lock raises ``LockedError`` at once, naming the holder's
    PID; with ``wait`` this blocks until it is free.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    holder = directory / HOLDER_FILE
    fd = os.open(directory, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            try:
                pid = holder.read_text().strip()
            except OSError:
                pid = "unknown"
            raise LockedError(f"{what} is in use by process {pid or 'unknown'}; wait for it to finish "
                              "or stop it first") from None
        holder.write_text(f"{os.getpid()}\n")
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                holder.unlink()
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def is_repository_root(folder: Path) -> bool:
    """A repository's root: a folder holding ``.git`` (a checkout, a worktree), or this package's checkout."""
    folder = folder.resolve()
    return (folder / ".git").exists() or folder == CHECKOUT


def checkpoint_holding(path: Path) -> Path | None:
    """The run's checkpoints/ folder, or the checkpoint or model folder (holding model.safetensors),
    that is or holds ``path``; None when there is none. A model folder that *is* ``path`` does not
    count: an output folder that exists is its caller's to check (an export's must be empty)."""
    path = path.resolve()
    for folder in (path, *path.parents):
        if folder.name == CHECKPOINTS and folder.is_dir() and (folder.parent / RUN_CONFIG).is_file():
            return folder
        if folder != path and (folder / MODEL_WEIGHTS).is_file():
            return folder
    return None


def json_object_with(path: Path, keys: Sequence[str]) -> bool:
    """True when ``path`` holds a JSON object with every one of ``keys``: how a command recognises
    its own earlier JSON output."""
    try:
        found = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(found, dict) and all(key in found for key in keys)


def check_output(path: str | os.PathLike | None, key: str, *, what: str = "", folder: bool = False,
                 ours: Callable[[Path], bool] | None = None, suffix: str | None = None,
                 beside: Sequence[Path] = ()) -> Path:
    """``path`` as a Path when the command that ``key`` belongs to may write it; else a one-line
    ValueError naming ``key``, the value and what is allowed. Every output of every command
    passes here (see the module docstring):

    - ``folder``: a folder the command fills (a run, a head analysis, an export), never a
      repository's root nor a file; it may exist, and what it holds is its caller's to check;
    - else a file of ``what`` (``an evaluation report``), ending in ``suffix`` if given: an
      existing one is replaced only when ``ours(file)`` recognises it as this command's earlier
      output, and the files written ``beside`` it (its figure) only when it is;
    - never empty, never inside a checkpoint or a run's checkpoints/ folder.
    """
    noun = "folder" if folder else "file"
    if not isinstance(path, (str, os.PathLike)) or not str(path).strip():
        raise ValueError(f"{key}={path!r} is invalid: an empty path; give a {noun} path")
    path = Path(path)
    shown, short = f"{key}={str(path)!r}", key.rpartition(".")[2]
    if folder and is_repository_root(path):
        raise ValueError(f"{shown} is invalid: it is the root of the repository {path.resolve()}; give "
                         f"{what or 'the output'} a folder of its own (e.g. runs/<name>)")
    holder = checkpoint_holding(path)
    if holder is not None:
        where = "it is" if holder == path.resolve() else "it is inside"
        raise ValueError(f"{shown} is invalid: {where} {holder}, which holds checkpoints or a model's files, "
                         "never other outputs (pruning deletes checkpoints); write beside it")
    if folder:
        if path.exists() and not path.is_dir():
            raise ValueError(f"{key} {str(path)!r} is a file; {what or 'the output'} needs a directory")
        return path
    if suffix is not None and path.suffix != suffix:
        raise ValueError(f"{shown} is invalid: {what} is a {suffix} file")
    if path.is_dir():
        raise ValueError(f"{shown} is a folder; give a file path for {what}")
    mine = path.exists() and ours is not None and ours(path)
    if path.exists() and not mine:
        raise ValueError(f"{key}: {path} exists and is not {what}: never overwritten; choose another {short}")
    for other in beside:
        if other.exists() and not mine:
            raise ValueError(f"{key}: {other} exists without {what} beside it, so it is not ours to "
                             f"overwrite; choose another {short}")
    return path
