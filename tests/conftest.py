"""Suite-wide settings. Fixtures live in the conftest.py beside their tests.

Every model in the suite is tiny: a second OpenMP thread gains nothing on it, and on shared
cores two threads mostly spin-wait for each other (measured here: 6-15x slower). So the suite,
and every subprocess it starts (which inherits the environment), runs on one thread.
"""

import os

import torch

os.environ["OMP_NUM_THREADS"] = "1"
torch.set_num_threads(1)
