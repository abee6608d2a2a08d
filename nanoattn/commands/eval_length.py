"""``scripts/eval_length.py``: perplexity of a checkpoint at several lengths (docs/extrapolation.md).

``run_length_eval`` loads the run, scores its held-out stream at every length and writes the
report (``<run dir>/length_eval[_<scaling>][_step<N>].json``) and its figure; ``eval_length``
is the command: the same, then the table on stdout. The measurement is ``nanoattn.eval.length``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nanoattn.eval.compare import length_table, length_table_caption
from nanoattn.eval.length import MODES, REPORT_STEM, evaluate_lengths, held_out_stream
from nanoattn.eval.plots import plot_length_curves
from nanoattn.eval.runs import AtLengthsConfig, checkpoint_fields
from nanoattn.model import check_streamable
from nanoattn.validation import check_choice, check_non_negative_int, check_positive_int


@dataclass
class LengthEvalConfig(AtLengthsConfig):
    """Every key of ``scripts/eval_length.py`` (the inherited ones: ``AtLengthsConfig``)."""

    owner = "eval_length"
    report_stem = REPORT_STEM
    # Another protocol's report goes beside the chunked one: <stem>_sliding_stride64.json, ...
    file_keys = {"mode": "", "stride": "stride", "n_sink": "sink"}

    # chunks: windows end to end | sliding: advanced by stride, the last stride scored | streaming:
    # StreamingLLM, the whole stream through a cache of each length, n_sink of it the first tokens
    mode: str = "chunks"
    stride: int | None = None  # sliding only; None: half of each length
    n_sink: int = 4  # streaming only: StreamingLLM's sink tokens (0: window attention alone)
    max_tokens: int = 32768  # targets scored at every length: the first max_tokens of the held-out split

    def __post_init__(self) -> None:
        super().__post_init__()
        check_choice(self.owner, "mode", self.mode, MODES)
        if self.stride is not None:
            check_positive_int(self.owner, "stride", self.stride)
        check_non_negative_int(self.owner, "n_sink", self.n_sink)
        check_positive_int(self.owner, "max_tokens", self.max_tokens)


def run_length_eval(cfg: LengthEvalConfig) -> dict[str, Any]:
    """Evaluate ``cfg.ckpt`` at every length; write the JSON report (and its figure). Returns the report."""
    checkpoint, data = cfg.load()
    if cfg.mode == "streaming":  # the rule sample.py's streaming_llm follows, asked of the encoding
        check_streamable(checkpoint.config, cfg.owner, "mode", cfg.mode)
    lengths = cfg.lengths_for(checkpoint, rows=1 if cfg.mode == "streaming" else None)
    sweep = evaluate_lengths(checkpoint.model, held_out_stream(data, cfg.max_tokens),
                             lengths, mode=cfg.mode, stride=cfg.stride,
                             batch_size=cfg.batch_size, dtype=cfg.dtype, bytes_per_token=data.bytes_per_token,
                             n_sink=cfg.n_sink)
    report = {
        **checkpoint_fields(checkpoint),
        "mode": cfg.mode,
        "stride": cfg.stride,
        "n_sink": cfg.n_sink if cfg.mode == "streaming" else None,
        "max_tokens": cfg.max_tokens,
        "data_dir": str(data.data_dir),
        "dtype": cfg.dtype,
        "device": cfg.device,
        "rope_scaling": checkpoint.config.rope_scaling,
        "rope_scaling_override": cfg.rope_scaling,
        "results": [r.to_dict() for r in sweep.results],
        "per_position_length": sweep.per_position_length,
        "per_position_loss": sweep.per_position_loss,
    }
    cfg.save(report, plot_length_curves)
    return report


def eval_length(cfg: LengthEvalConfig) -> dict[str, Any]:
    """The command: ``run_length_eval``, then the perplexity table and the files written.

    A length that fails (longer than the held-out text, undefined for the encoding, out of
    memory) is a row with its error; when every length failed the work was not done, so the
    command fails too (after writing the report, which says why).
    """
    report = run_length_eval(cfg)
    print(length_table_caption() + length_table([report], [cfg.label()]), end="")
    print(cfg.written())
    errors = [r["error"] for r in report["results"] if r.get("error")]
    if len(errors) == len(report["results"]):
        raise ValueError(f"every length failed; the first: {errors[0]}")
    return report
