"""Runtime policy: device choice, the autocast dtype from the CPU's flags, atomic writes, outputs."""

import os
import platform
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch._inductor.runtime.runtime_utils import default_cache_dir

from nanoattn import runtime


def test_auto_dtype_follows_the_cpu_flags(monkeypatch):
    cpu = torch.device("cpu")
    for fast in ({"avx2", "amx_bf16", "amx_tile"}, {"avx512f", "avx512_bf16"}):
        monkeypatch.setattr(runtime.device, "cpu_flags", lambda fast=fast: fast)
        assert runtime.autocast_dtype("auto", cpu)[0] is torch.bfloat16
    monkeypatch.setattr(runtime.device, "cpu_flags", lambda: {"avx2", "avx512f", "avx512bw"})
    assert runtime.autocast_dtype("auto", cpu)[0] is None
    assert runtime.autocast_dtype("bfloat16", cpu)[0] is torch.bfloat16
    assert runtime.autocast_dtype("float16", cpu)[0] is torch.float16
    assert runtime.autocast_dtype("float32", cpu)[0] is None
    with pytest.raises(ValueError, match=r"dtype='half' is invalid: allowed: auto \| float32"):
        runtime.autocast_dtype("half", cpu)


def test_compile_auto_compiles_only_where_a_compiler_is_and_true_without_one_is_refused(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setenv("CXX", sys.executable)  # an executable that exists
    assert runtime.compile_choice("auto", cpu) == (True, "compiled (auto: Inductor's compiler is here)")
    assert runtime.compile_choice(True, cpu)[0] is True
    monkeypatch.setenv("CXX", "no-such-compiler")
    assert runtime.compile_choice("auto", cpu) == (
        False, "eager (auto: no C++ compiler (no-such-compiler, or $CXX) for the CPU)")
    with pytest.raises(ValueError, match=r"^train.compile=true is invalid here: no C\+\+ compiler "
                                         r"\(no-such-compiler, or \$CXX\) for the CPU; train.compile=auto"):
        runtime.compile_choice(True, cpu, "train.compile")
    assert runtime.compile_choice(False, cpu) == (False, "eager (train.compile=false)")
    monkeypatch.setenv("CXX", sys.executable)
    monkeypatch.setattr(runtime.compilation.sysconfig, "get_path", lambda name: "/no/such/include")
    assert runtime.compile_choice("auto", cpu) == (
        False, "eager (auto: no Python headers (/no/such/include/Python.h) for Inductor's C++ kernels)")
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match=r"^bench.compile=.* is invalid: allowed: true \| false \| auto"):
            runtime.compile_choice(bad, cpu, "bench.compile")


def test_compiled_kernels_are_cached_under_nanoattns_cache_unless_inductor_is_told(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("NANOATTN_CACHE", str(tmp_path))
    assert runtime.use_compile_cache() == tmp_path / "torchinductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())  # as importing Inductor leaves it
    assert runtime.use_compile_cache() == tmp_path / "torchinductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "own"))
    assert runtime.use_compile_cache() == tmp_path / "own"


def test_float32_switches_an_enclosing_autocast_off():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ b).dtype is torch.bfloat16
        with runtime.autocast(torch.device("cpu"), None):
            assert (a @ b).dtype is torch.float32


def test_an_unavailable_device_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match=r"train\.device='cuda' is invalid: no cuda device"):
        runtime.pick_device("cuda", "train.device")
    with pytest.raises(ValueError, match=r"device='tpu' is invalid: allowed: auto \| cpu"):
        runtime.pick_device("tpu")
    assert runtime.pick_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert runtime.pick_device("auto") == torch.device("cpu")


def test_write_atomic_replaces_whole_and_leaves_no_temporary(tmp_path, monkeypatch):
    target = tmp_path / "f.txt"
    runtime.write_atomic(target, "old\n")
    real_replace = os.replace

    def killed(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(OSError):
        runtime.write_atomic(target, "new\n")
    monkeypatch.setattr(os, "replace", real_replace)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]
    runtime.write_atomic(target, b"new\n")
    assert target.read_text() == "new\n"


def test_a_held_lock_refuses_naming_the_holder_and_dies_with_it(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c",
                               "import sys, time\nfrom nanoattn.runtime import exclusive_lock\n"
                               f"with exclusive_lock({str(folder)!r}, 'run x'):\n"
                               "    print('held', flush=True)\n    time.sleep(600)\n"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(runtime.LockedError) as err:
            with runtime.exclusive_lock(folder, "run x"):
                pass
        assert str(err.value) == (f"run x is in use by process {holder.pid}; "
                                  "wait for it to finish or stop it first")
    finally:
        holder.send_signal(signal.SIGKILL)  # no cleanup runs: the OS releases the lock
        holder.wait()
    with runtime.exclusive_lock(folder, "run x"):
        assert (folder / ".lock").read_text() == f"{os.getpid()}\n"


def test_waiting_for_a_lock_blocks_until_it_is_released(tmp_path):
    order = []

    def second():
        with runtime.exclusive_lock(tmp_path, "data root", wait=True):
            order.append("second")

    with runtime.exclusive_lock(tmp_path, "data root"):
        thread = threading.Thread(target=second)
        thread.start()
        thread.join(0.3)
        order.append("first done")
    thread.join(10)
    assert order == ["first done", "second"]


FAULTS_OF_REUSED_BLOCKS = """
import ctypes, resource, sys
from nanoattn.runtime import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def cycle():  # a step's activations: 25 blocks of 4 MiB, written, all freed at its end
    blocks = [libc.malloc(4 * 2**20) for _ in range(25)]
    for block in blocks:
        ctypes.memset(block, 1, 4 * 2**20)
    for block in blocks:
        libc.free(block)
for _ in range(3):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    cycle()
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_kept_memory_is_reused_without_page_faults():
    def faults(mode: str) -> tuple[str, int]:
        out = subprocess.run([sys.executable, "-c", FAULTS_OF_REUSED_BLOCKS, mode], capture_output=True,
                             text=True, check=True).stdout.split()
        return out[0], int(out[1])

    (applied, kept), (_, default) = faults("keep"), faults("default")
    assert applied == "True"
    # By default glibc trims the freed 100 MiB off the heap, so each cycle faults its 25,600 pages in
    # again (255,680 in 10 cycles here); kept, the heap's pages are reused.
    assert default > 100_000 and kept < 1_000, (kept, default)


def test_keep_freed_memory_leaves_another_c_library_alone(monkeypatch):
    def no_library(name):
        raise AssertionError(f"loaded {name} where the C library is not glibc")

    monkeypatch.setattr(runtime.process.platform, "libc_ver", lambda: ("musl", "1.2"))
    monkeypatch.setattr(runtime.process.ctypes, "CDLL", no_library)
    assert runtime.keep_freed_memory() is False


def test_check_output_is_one_rule_for_every_output(tmp_path):
    """Never empty, never a repository's root to fill, never inside a checkpoint, never over a file
    that is not the command's own (nor over a figure beside a file that is not)."""
    check = runtime.check_output
    repo = Path(__file__).resolve().parents[1]
    for value, message in (("", "k='' is invalid: an empty path; give a file path"),
                           (None, "k=None is invalid: an empty path")):
        with pytest.raises(ValueError, match=re.escape(message)):
            check(value, "k")
    with pytest.raises(ValueError, match=re.escape(f"k='{repo}' is invalid: it is the root of the")):
        check(repo, "k", folder=True)
    assert check(repo / "runs" / "x", "k", folder=True) == repo / "runs" / "x"
    run = tmp_path / "run"
    (run / "checkpoints" / "000010").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (run / "checkpoints" / "000010" / "model.safetensors").write_bytes(b"weights")
    for path, holder in ((run / "checkpoints" / "000010" / "r.json", run / "checkpoints" / "000010"),
                         (run / "checkpoints" / "heads", run / "checkpoints")):
        with pytest.raises(ValueError, match=re.escape(f"is invalid: it is inside {holder}, which holds")):
            check(path, "k", what="a report")
    mine, theirs = tmp_path / "mine.json", tmp_path / "theirs.json"
    figure = theirs.with_suffix(".png")
    mine.write_text('{"ours": 1}')
    theirs.write_text('{"x": 1}')
    figure.write_bytes(b"a figure")

    def ours(path):
        return runtime.json_object_with(path, ["ours"])

    assert check(mine, "k", what="a report", ours=ours, beside=[mine.with_suffix(".png")]) == mine
    with pytest.raises(ValueError, match=re.escape(f"k: {theirs} exists and is not a report: never")):
        check(theirs, "k", what="a report", ours=ours)
    theirs.unlink()
    with pytest.raises(ValueError, match=re.escape(f"k: {figure} exists without a report beside it, so it is "
                                                   "not ours to overwrite; choose another k")):
        check(theirs, "k", what="a report", ours=ours, beside=[figure])
