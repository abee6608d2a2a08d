"""Evaluation: measurements on models and token streams, and what a checkpoint's evaluation shares.

The package exports each module's main entry points; the finer parts (a head's kind rule, its
attention maps, the head and pruning tables) are imported from their module.

``length`` (perplexity past the training length), ``passkey`` (retrieval, and the training mix),
``heads`` (what each head does, importance, pruning), ``variant_heads`` (what an attention
variant's own pieces do), ``compare`` (length reports side by side); ``runs`` loads a run's model
and data and names its report files, ``tables`` and ``plots`` draw them. ``plots`` is imported from
its module only: matplotlib then loads where a figure is drawn, not in every training process. The
command lines around them (configs, printing) are ``nanoattn.commands``.
"""

from nanoattn.eval.compare import length_table, load_report
from nanoattn.eval.heads import (
    ablation_importance,
    delimiter_ids,
    gradient_importance,
    head_statistics,
    mean_loss,
    prune_heads,
    pruning_curve,
)
from nanoattn.eval.length import (
    LengthResult,
    LengthSweep,
    PeakMemory,
    evaluate_lengths,
    held_out_stream,
    lengths_from_multiples,
    score_length,
)
from nanoattn.eval.passkey import PasskeyMix, evaluate_passkey, passkey_summary_table, passkey_table
from nanoattn.eval.runs import load_for_eval, run_data_dir
from nanoattn.eval.tables import format_table, write_table
from nanoattn.eval.variant_heads import variant_statistics

__all__ = ["ablation_importance", "delimiter_ids", "gradient_importance", "head_statistics", "mean_loss",
           "prune_heads", "pruning_curve", "variant_statistics",
           "LengthResult", "LengthSweep", "PeakMemory", "evaluate_lengths", "held_out_stream",
           "lengths_from_multiples", "score_length",
           "length_table", "load_report",
           "PasskeyMix", "evaluate_passkey", "passkey_summary_table", "passkey_table",
           "load_for_eval", "run_data_dir", "format_table", "write_table"]
