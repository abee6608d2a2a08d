"""Devices and dtypes: one vocabulary for each, where tensors live, and how much memory they may use.

- One device vocabulary (``auto | cpu | cuda | mps``; ``cuda:1`` too) and one rule for ``auto``:
  cuda, else mps, else cpu. An explicit device must exist.
- One dtype vocabulary (``auto | float32 | bfloat16 | float16``). Weights stay float32; any
  other dtype is autocast. ``auto`` takes bfloat16 where the hardware computes it natively:
  a CUDA GPU that supports it, or a CPU with AMX (``amx_bf16``) or AVX512-BF16
  (``avx512_bf16``) read from /proc/cpuinfo. Elsewhere bf16 is emulated and slower than float32.
- Memory: ``check_fits`` is the one size check of every entry point, before anything is allocated.
"""

from __future__ import annotations

import os
import platform
from typing import Any

import torch

from nanoattn.validation import fail

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")


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


def autocast(device: torch.device, dtype: torch.dtype | None):
    """The autocast context for ``dtype`` (None: float32, with any enclosing autocast switched off)."""
    if dtype is None or dtype == torch.float32:
        return torch.autocast(device.type, enabled=False)
    return torch.autocast(device.type, dtype=dtype)


def memory_bytes(device: torch.device) -> int:
    """The memory a tensor on ``device`` can use: the GPU's, else the machine's physical memory."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def fits(nbytes: int, device: torch.device) -> bool:
    """Whether ``nbytes`` fit the device's memory (``memory_bytes``)."""
    return nbytes <= memory_bytes(device)


def check_fits(nbytes: int, device: torch.device, what: str, *, key: tuple[str, str, Any] | None = None,
               advice: str | None = None, at_least: bool = False) -> None:
    """Refuse, before allocating, ``what`` when its ``nbytes`` exceed the device's memory.

    The one size check of every entry point. The error is one line: with ``key`` (owner, name,
    value) it names the option that asked for the size (``owner.name=value is invalid: ...``),
    and ``advice`` is appended when given. ``at_least``: ``nbytes`` is a lower bound.
    """
    if fits(nbytes, device):
        return
    have = memory_bytes(device)
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
