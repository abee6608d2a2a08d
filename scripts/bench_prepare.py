"""Measure streamed preparation: ``python scripts/bench_prepare.py [sizes_mb=[4,40]] [out=docs/results]``.

Prepares generated JSON-lines corpora of each size, each in a process of its own, and reports its
peak resident memory; then SIGKILLs a preparation of the largest mid-shard, resumes it, and checks its
shards byte for byte. All the work is ``nanoattn.bench.prepare``; the page is ``<out>/prepare.md``.
"""

from _hydra_cli import command

from nanoattn.bench.prepare import PrepareBenchConfig, run_prepare_bench

main = command("bench_prepare", PrepareBenchConfig, run_prepare_bench)

if __name__ == "__main__":
    main()
