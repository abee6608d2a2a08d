"""Benchmark nanoattn: ``python scripts/bench.py [only=[train,mfu,...]] [quick=true] [key=value ...]``.

Sections (``nanoattn.bench`` states each rule):
- ``train``: training-step tokens/s, nanoattn vs transformers' Llama of the same shape and weights;
- ``mfu``: those rates over the machine's measured matmul peak;
- ``decode``: with and without the KV cache, MHA/GQA/MQA, and greedy vs transformers' ``generate``
  on the same weights, with a check that the tokens are identical;
- ``eval``: evaluation tokens/s and peak memory at 1x, 4x and 16x the training length per encoding;
- ``e2e``: the training script's tokens/s read from ``run``'s metrics.jsonl vs the bare step;
- ``labs`` (only when named): each lab's training job, eager and compiled, by scripts/train.py.
Rows from every section are printed as tables and written as a results page (``bench.json`` and
``bench.md``, with the settings they were measured under) in runs/bench, or in the folder ``out``
names (``out=docs/results`` publishes it). Every key and its
default: ``nanoattn.bench.BenchConfig`` (or ``--cfg job``); a user mistake ends in one ``error:`` line.
"""

import dataclasses

from _hydra_cli import TRAINER, command

from nanoattn.bench import BenchConfig, run_bench

main = command("bench", BenchConfig,
               lambda cfg: run_bench(cfg if cfg.trainer else dataclasses.replace(cfg, trainer=list(TRAINER))))

if __name__ == "__main__":
    main()
