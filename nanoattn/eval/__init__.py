"""Evaluation: head analysis (``heads``), length extrapolation (``length``, ``compare``), ``passkey``."""

from nanoattn.eval.compare import compare_length, extrapolation_lab, load_report, markdown_table
from nanoattn.eval.heads import (
    HeadAnalysisConfig,
    ablation_importance,
    analyze_heads,
    attention_maps,
    classify_head,
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
    evaluate_lengths,
    lengths_from_multiples,
    plot_length_curves,
    run_length_eval,
    score_length,
)
from nanoattn.eval.passkey import PasskeyMix, evaluate_passkey, passkey_table, plot_passkey, run_passkey_eval

__all__ = ["HeadAnalysisConfig", "ablation_importance", "analyze_heads", "attention_maps", "classify_head",
           "delimiter_ids", "gradient_importance", "head_statistics", "mean_loss", "prune_heads",
           "pruning_curve",
           "LengthResult", "LengthSweep", "evaluate_lengths", "lengths_from_multiples", "plot_length_curves",
           "run_length_eval", "score_length",
           "compare_length", "extrapolation_lab", "load_report", "markdown_table",
           "PasskeyMix", "evaluate_passkey", "passkey_table", "plot_passkey", "run_passkey_eval"]
