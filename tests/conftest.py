"""Suite-wide settings, and the fixtures tests in more than one folder share. Other fixtures live in
the conftest.py beside their tests.

Every model in the suite is tiny: a second OpenMP thread gains nothing on it, and on shared
cores two threads mostly spin-wait for each other (measured here: 6-15x slower). So the suite,
and every subprocess it starts (which inherits the environment), runs on one thread.
"""

import os

import pytest
import torch

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)


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
    from nanoattn.model import kernels

    kernels.bf16_attention_timing.cache_clear()
    yield
    kernels.bf16_attention_timing.cache_clear()
