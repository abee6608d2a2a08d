"""``scripts/analyze_heads.py``: what each attention head of a checkpoint does, and pruning (docs/heads.md).

``analyze_heads`` loads the run and its data (``nanoattn.eval.runs.load_for_eval``: the run's
data folder, the checkpoint's tokenizer), takes evenly spaced validation windows, measures
(``nanoattn.eval.heads``, ``nanoattn.eval.variant_heads``), draws (``nanoattn.eval.plots``) and
writes heads.json, then prints the per-head and pruning tables. Its folder defaults to
``<run>/heads/<checkpoint>``, beside the checkpoints and never inside one (pruning deletes
checkpoints); a folder's heads.json and figures are replaced only when they are an earlier analysis
(``nanoattn.runtime.check_output``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from nanoattn.checkpoint import resolve_checkpoint, run_directory
from nanoattn.config import ModelConfig
from nanoattn.eval.heads import (
    BROAD_MIN_ENTROPY,
    DELIMITER_MASS,
    FIRST_QUERY,
    IMPORTANCE,
    LOCAL_MAX_OFFSET,
    POSITIONAL_MASS,
    PRUNE_SCOPES,
    attention_maps,
    check_head,
    delimiter_ids,
    head_statistics,
    heads_table,
    pruning_curve,
    pruning_table,
)
from nanoattn.eval.plots import (
    plot_attention_grid,
    plot_attention_head,
    plot_importance,
    plot_pruning,
    token_labels,
)
from nanoattn.eval.runs import CheckpointEvalConfig, is_path, load_for_eval, write_report
from nanoattn.eval.variant_heads import variant_statistics
from nanoattn.runtime import check_fits, check_output, json_object_with
from nanoattn.validation import check_choice, check_positive_int, declared_defaults, fail, largest_departure

TOKEN_BYTES = 8  # int64 ids
WEIGHT_BYTES = 4  # float32 attention weights

HEADS_KEYS = ("checkpoint", "heads", "pruning")  # what marks a heads.json as an earlier analysis


@dataclass
class HeadAnalysisConfig(CheckpointEvalConfig):
    """Every key of ``scripts/analyze_heads.py`` (ckpt, data_dir, device: ``CheckpointEvalConfig``)."""

    owner = "analyze_heads"

    out_dir: str | None = None  # None: <run dir>/heads/<checkpoint name>, beside the checkpoints
    text: str | None = None  # text for the attention maps; None: the first map_len validation tokens
    map_len: int = 64
    head: list[int] | None = None  # [layer, head]: also draw that head's map at full size, tokens on the axes
    seq_len: int | None = None  # window length for statistics and importance; None: the training length
    batch_size: int = 8
    n_batches: int = 8  # windows = n_batches * batch_size, evenly spaced over the validation split
    importance: str = "ablation"  # ablation (loss increase, one evaluation per head) | gradient (Michel 2019)
    prune_scope: str = "global"  # global (the k least important of all heads) | layer (as many per layer)
    prune_steps: int = 10  # pruning fractions 0, 1/steps, ..., 1

    def __post_init__(self) -> None:
        super().__post_init__()
        own = self.owner
        if self.out_dir is not None and not is_path(self.out_dir):
            fail(own, "out_dir", self.out_dir, "must be a folder or null")
        for name in ("map_len", "batch_size", "n_batches", "prune_steps"):
            check_positive_int(own, name, getattr(self, name))
        if self.seq_len is not None:
            check_positive_int(own, "seq_len", self.seq_len)
            if self.seq_len <= FIRST_QUERY:
                fail(own, "seq_len", self.seq_len, f"must be above {FIRST_QUERY}")
        if self.text is not None and (not isinstance(self.text, str) or not self.text):
            fail(own, "text", self.text, "must be a non-empty string or null")
        if self.head is not None and (not isinstance(self.head, Sequence) or len(self.head) != 2):
            fail(own, "head", self.head, "must be [layer, head] or null")
        check_choice(own, "importance", self.importance, tuple(IMPORTANCE))
        check_choice(own, "prune_scope", self.prune_scope, PRUNE_SCOPES)


def check_heads_output(cfg: HeadAnalysisConfig) -> Path:
    """The analysis folder (``out_dir``, else ``<run dir>/heads/<checkpoint name>``), checked before
    any work: not a repository's root nor inside a checkpoint, and its heads.json and figures new
    or an earlier analysis."""
    key = f"{cfg.owner}.out_dir"
    if cfg.out_dir is not None:
        out_dir = check_output(cfg.out_dir, key, what="a head analysis", folder=True)
    else:
        ckpt = resolve_checkpoint(cfg.ckpt)
        out_dir = run_directory(ckpt) / "heads" / ckpt.name
    figures = ["attention_maps.png", "importance.png", "pruning.png"]
    if cfg.head is not None:
        figures.append(f"attention_L{cfg.head[0]}H{cfg.head[1]}.png")
    check_output(out_dir / "heads.json", key, what="a head analysis (heads.json)",
                 ours=lambda file: json_object_with(file, HEADS_KEYS), beside=[out_dir / f for f in figures])
    return out_dir


DEFAULTS = declared_defaults(HeadAnalysisConfig)


def check_analysis_fits(cfg: HeadAnalysisConfig, model: ModelConfig, train_seq_len: int, map_tokens: int,
                        device: torch.device) -> None:
    """Refuse, before a window is read, an analysis that cannot fit ``device``: the validation
    windows (int64 inputs and targets, all kept), every layer's attention weights of one batch
    (the statistics read them from the slow path) and the maps of the ``map_tokens`` drawn. The
    error names the option furthest above its default."""
    seq_len = cfg.seq_len or train_seq_len
    heads, windows = model.n_layer * model.attention_heads, cfg.n_batches * cfg.batch_size
    sizes = {name: (getattr(cfg, name), DEFAULTS[name]) for name in ("batch_size", "n_batches")}
    name = largest_departure({**sizes, "seq_len": (seq_len, train_seq_len)})
    layout = f"{model.n_layer} layers x {model.attention_heads} heads"
    what = f"{windows:,} windows of {seq_len:,} tokens and a batch's attention weights ({layout})"
    check_fits(2 * TOKEN_BYTES * windows * seq_len + WEIGHT_BYTES * heads * cfg.batch_size * seq_len**2,
               device, what, key=(cfg.owner, name, getattr(cfg, name)), at_least=True)
    map_key = (cfg.owner, "text", cfg.text) if cfg.text is not None else (cfg.owner, "map_len", cfg.map_len)
    check_fits(WEIGHT_BYTES * heads * map_tokens**2, device,
               f"attention maps of {map_tokens:,} tokens ({layout})", key=map_key)


def analyze_heads(cfg: HeadAnalysisConfig) -> dict[str, Any]:
    """Statistics, importance, pruning and attention maps of a checkpoint, written to ``out_dir``.

    Files: heads.json, attention_maps.png, importance.png, pruning.png and, with ``cfg.head``,
    attention_L<layer>H<head>.png. Returns the heads.json content.
    """
    out_dir = check_heads_output(cfg)
    ckpt, data = load_for_eval(cfg.ckpt, device=cfg.device, data_dir=cfg.data_dir)
    # A differential model's heads are its n_head / 2 pairs: every table, label and figure counts those.
    model, n_layer, n_head = ckpt.model, ckpt.config.n_layer, ckpt.config.attention_heads
    device = next(model.parameters()).device
    focus = check_head(model, cfg.head, cfg.owner) if cfg.head is not None else None
    seq_len = cfg.seq_len or ckpt.train_seq_len
    if cfg.text is not None:
        ids = data.tokenizer.encode(cfg.text).ids
    else:
        ids = data.tokens("val")[:cfg.map_len].tolist()
    if not ids:
        raise ValueError(f"text={cfg.text!r} encodes to no tokens: give some text for the attention maps")
    check_analysis_fits(cfg, ckpt.config, ckpt.train_seq_len, len(ids), device)
    batches = [(x.to(device), y.to(device))
               for x, y in data.val_batches(cfg.n_batches, batch_size=cfg.batch_size, seq_len=seq_len)]
    out_dir.mkdir(parents=True, exist_ok=True)
    kind = f"differential heads (pairs of its {ckpt.config.n_head} query heads; " if ckpt.config.diff_attn \
        else "heads ("
    print(f"{ckpt.path}: {n_layer} layers x {n_head} {kind}{ckpt.config.n_kv_head} kv), "
          f"{len(batches) * cfg.batch_size} validation windows of {seq_len} tokens from {data.data_dir}")

    heads = head_statistics(model, batches, delimiter_ids(data.tokenizer))
    variants = variant_statistics(model, batches)
    importance = IMPORTANCE[cfg.importance](model, batches)
    for record in heads:
        record["importance"] = float(importance[record["layer"], record["head"]])
    curve = pruning_curve(model, batches, importance, scope=cfg.prune_scope, steps=cfg.prune_steps)

    maps = attention_maps(model, torch.tensor([ids], device=device))[0]  # [n_layer, n_head, T, T]
    plot_attention_grid(maps, out_dir / "attention_maps.png",
                        [f"L{r['layer']} H{r['head']} {r['kind']}" for r in heads])
    if focus is not None:
        layer, head = focus
        plot_attention_head(maps[focus], out_dir / f"attention_L{layer}H{head}.png",
                            f"layer {layer} head {head} ({heads[layer * n_head + head]['kind']})",
                            token_labels(data.tokenizer, ids))
    plot_importance(heads, n_layer, n_head, out_dir / "importance.png", cfg.importance)
    plot_pruning(curve, out_dir / "pruning.png", cfg.prune_scope, cfg.importance)

    report = {
        "checkpoint": str(ckpt.path), "step": ckpt.step, "data_dir": str(data.data_dir),
        "windows": {"count": len(batches) * cfg.batch_size, "seq_len": seq_len},
        "importance_method": cfg.importance, "prune_scope": cfg.prune_scope, "base_loss": curve[0]["loss"],
        "thresholds": {"first_query": FIRST_QUERY, "positional_mass": POSITIONAL_MASS,
                       "delimiter_mass": DELIMITER_MASS, "local_max_offset": LOCAL_MAX_OFFSET,
                       "broad_min_entropy": BROAD_MIN_ENTROPY},
        "heads": heads, "pruning": curve, "variants": variants,
    }
    write_report(out_dir / "heads.json", report)
    print(heads_table(heads), end="")
    print(pruning_table(curve), end="")
    for name, stats in variants.items():  # the summaries; the per-head lists are in heads.json
        summary = ", ".join(f"{key} {value:.3f}" for key, value in stats.items() if isinstance(value, float))
        print(f"{name}: {summary or 'per layer and head in heads.json'}")
    print(f"wrote {out_dir}/heads.json and plots")
    return report
