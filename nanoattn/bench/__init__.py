"""Benchmarks: nanoattn side by side with transformers on the same machine, and against the hardware.

``scripts/bench.py`` composes ``configs/bench.yaml`` into a ``BenchConfig`` and calls
``run_bench``. One module per group of sections, each stating its rules:

- ``train``: training-step tokens/s, nanoattn vs transformers' Llama built from the same weights,
  both through the training loop's ``optimizer_step``; ``mfu``: those rates over the machine's
  measured matmul peak (``train.py``).
- ``decode``: with and without the KV cache, MHA/GQA/MQA, greedy vs transformers' ``generate``
  with a token-identity check (``decode.py``).
- ``eval``: tokens/s and peak memory at 1x, 4x and 16x the training length (``evaluation.py``).
- ``e2e``: a finished run's tokens/s vs its bare training step (``e2e.py``).
- ``encodings`` and ``attention``: the training tokens/s of every positional encoding and every
  attention variant side by side, as a ratio to RoPE's and to the plain block's: each one's
  price (``variants.py``).
- ``profile``: one training step of the default run under torch.profiler, its time by kind of
  work: matmuls, attention, softmax and loss, norms, optimizer, casts... (``profile.py``).
- ``labs``: one training job of each lab, eager and compiled in alternated rounds, each the lab's
  own training command: what compiling the step does to a lab's wall time (``labs.py``).
- ``speedrun``: the default recipe and a candidate trained back to back, the time each needs to a
  target val_bpb and the val_bpb each reaches in the reference's time (``speedrun.py``);
  ``sweep``: the recipe table of a finished recipe sweep, steps to the target per run and seed
  (``sweep.py``).

Design choices shared by all (``core.py``): implementations compared with each other run in one
process, one repetition of each in turn, each reporting the median of its repetitions after
untimed warm-up rounds (compilation, allocator, autocast's weight casts). Load from other
processes then hits both alike, so the ratios hold on a shared machine where absolute numbers
do not. Tokens per second is wall time. The transformers side is nanoattn's own weights
exported and loaded back (``twin.py``), so both compute the same function.
"""

from nanoattn.bench import (  # noqa: F401 (importing a section module registers its sections)
    decode,
    e2e,
    evaluation,
    labs,
    profile,
    speedrun,
    sweep,
    train,
    variants,
)
from nanoattn.bench.core import SECTIONS, BenchConfig, run_sections
from nanoattn.bench.e2e import read_run_rate
from nanoattn.bench.evaluation import EVAL_POSITIONS
from nanoattn.bench.report import format_table, run_bench

__all__ = ["EVAL_POSITIONS", "SECTIONS", "BenchConfig", "format_table", "read_run_rate", "run_bench",
           "run_sections"]
