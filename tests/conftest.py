"""Suite-wide settings, and the fixtures tests in more than one folder share. Other fixtures live in
the conftest.py beside their tests.

Every model in the suite is tiny: a second OpenMP thread gains nothing on it, and on shared
cores two threads mostly spin-wait for each other. So the suite, and every subprocess it starts
(which inherits the environment), runs on one thread.

The suite never touches the user's cache (``nanoattn.runtime.cache_dir``: kernel choices, the
corpus sdist, compiled kernels): the first process of a session makes an empty cache folder of its
own, which its xdist workers and every subprocess inherit through ``$NANOATTN_CACHE``, and removes it
at the end. Each session therefore starts cold, as on CI's fresh machine.
"""

import gc
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
# Inductor trusts the CPU's flags for its vector instructions instead of building and loading a test
# library per instruction set in each process that compiles. Read when Inductor's config is imported,
# after this; subprocesses inherit it.
os.environ["TORCHINDUCTOR_VEC_ISA_OK"] = "1"
SUITE_CACHE = "NANOATTN_SUITE_CACHE"  # set by the session's first process: the folder it made


def pytest_configure(config):
    if SUITE_CACHE not in os.environ:  # the session's first process (xdist's controller, or the only one)
        os.environ[SUITE_CACHE] = tempfile.mkdtemp(prefix="nanoattn-suite-cache-")
        config.made_suite_cache = True
    os.environ["NANOATTN_CACHE"] = os.environ[SUITE_CACHE]
    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)  # compiled kernels go under it too


def pytest_unconfigure(config):
    if getattr(config, "made_suite_cache", False):
        shutil.rmtree(os.environ.pop(SUITE_CACHE), ignore_errors=True)


# Where the tests that train in subprocesses or compile live. xdist's workers start from the two halves of
# the collection and steal from each other's queues: with these first, each worker's last tests are
# short ones, and neither waits at the end for the other's long test.
LONG_TESTS_FIRST = ("tests/train/", "tests/eval/test_labs.py", "tests/test_generate.py", "tests/test_hf.py")


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: not item.nodeid.startswith(LONG_TESTS_FIRST))  # stable: order kept within


def pytest_runtest_teardown(item):
    """The library collects garbage where it measures memory and where a run ends. After each test its
    garbage is collected and what lives on (pytest's, torch's and every module's objects) frozen, so
    those collections walk only what the test at hand made."""
    gc.collect()
    gc.freeze()


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="the device of the tests marked `device` and `gpu` (make gpu-check: cuda)")


@pytest.fixture
def device(request) -> torch.device:
    """The device ``--device`` names: the CPU in the suite, CUDA under ``make gpu-check``."""
    return torch.device(request.config.getoption("--device"))


@pytest.fixture(autouse=True)
def torch_determinism_as_found():
    """A compiled training step switches torch's deterministic algorithms on for its whole process
    (``nanoattn.runtime.use_deterministic_compilation``): the next test in the worker starts without."""
    found = (torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.utils.deterministic.fill_uninitialized_memory)
    yield
    torch.use_deterministic_algorithms(found[0], warn_only=found[1])
    torch.utils.deterministic.fill_uninitialized_memory = found[2]


@pytest.fixture
def fresh_attention_timings():
    """``kernels.bf16_matmuls_faster`` answers from scratch in the test (a process keeps its first
    answer per shape), and later tests do not see the test's answers."""
    from nanoattn import kernels

    kernels.bf16_attention_timing.cache_clear()
    yield
    kernels.bf16_attention_timing.cache_clear()


@pytest.fixture(scope="session")
def trainer():
    """How a lab trains, as the lab scripts give it: scripts/train.py, and what it resolves to."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    sys.path.insert(0, str(scripts))
    from _hydra_cli import TRAINER, training_config  # scripts/ is not a package

    from nanoattn.commands.labs import Trainer

    return Trainer(TRAINER, training_config)
