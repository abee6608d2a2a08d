"""Head analysis: what each attention head attends to, how much the model needs it, and pruning.

Design choices:

- Attention weights come only from the model's slow path (``GPT.attention_maps``); the fast SDPA
  path never materialises them. Tests check that both paths give the same logits.
- Statistics average over queries ``FIRST_QUERY``.. of every validation window. From query 2 on,
  the first, the previous and the current token are three distinct keys, so their masses never
  double count and at most one of them can pass the 0.5 that names a head after it.
- "First token" is the first token of the window. Training windows also start at arbitrary
  offsets, so a head that parks its attention there is an attention sink (Xiao et al. 2023,
  arXiv:2309.17453), not a beginning-of-document detector.
- Delimiters are decided from the tokenizer's own decoded strings (any tokenizer, no word list):
  a token is one when it decodes to punctuation and whitespace only, with at least one
  punctuation mark or newline (",", ".\\n", "\\n\\n", " ;"). Special tokens such as
  ``<|endoftext|>``, the document boundary, count too.
- A head's ``kind`` is a fixed rule over its statistics (``classify_head``, thresholds below).
- Importance is the validation loss increase when one head alone is masked (``head_mask``
  multiplies head outputs), or the proxy of Michel et al. 2019 (arXiv:1905.10650),
  |dL/d mask_h| at mask = 1 averaged over batches: one backward pass per batch instead of one
  evaluation per head. Pruning ranks heads once by that importance (no re-estimation after each
  removal) and masks the k lowest, over all heads ("global") or the same number in every layer.
- In GQA/MQA a mask removes one query head's output; the K/V head it shares keeps serving the
  other query heads of its group.
"""

from __future__ import annotations

import json
import operator
import unicodedata
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml
from matplotlib.figure import Figure

from nanoattn.checkpoint import load_checkpoint, resolve_checkpoint
from nanoattn.config import DataConfig
from nanoattn.data import TokenData, data_dir
from nanoattn.model import GPT
from nanoattn.validation import check_choice, check_positive_int, fail, from_dict

# The first query the statistics average over; queries 0 and 1 see fewer than three distinct keys.
FIRST_QUERY = 2
# A head is named after the first token, the previous token or itself when that key gets at least
# this share of a query's attention on average: a majority, so at most one of the three can pass.
POSITIONAL_MASS = 0.5
# ... after delimiters when they get a majority: well above their share of the keys, which near-uniform
# heads put at 0.22 on Shakespeare with the default BPE (docs/heads.md).
DELIMITER_MASS = 0.5
# "local": the attended keys are on average at most this many tokens back (windows are far longer).
LOCAL_MAX_OFFSET = 4.0
# "broad": entropy / ln(keys the query sees) at least this; 1 is uniform over the whole prefix.
BROAD_MIN_ENTROPY = 0.6
KINDS = ("first_token", "previous_token", "current_token", "delimiter", "local", "broad", "mixed")
PRUNE_SCOPES = ("global", "layer")
DEFAULT_DATA_DIR = "data/shakespeare"
# Per-head maps label their axes with the tokens up to this length; longer ones would be unreadable.
MAX_LABELLED_TOKENS = 96
STATISTICS = ("entropy", "normalized_entropy", "mean_offset", "prev_token_mass", "first_token_mass",
              "current_token_mass", "delimiter_mass")

Batch = tuple[torch.Tensor, torch.Tensor]  # (x, y), each int64 [B, T]


# ---------------------------------------------------------------------------------------------------------
# Masks, losses, maps


def prune_heads(model: GPT, heads: Iterable[Sequence[int]]) -> torch.Tensor:
    """A ``head_mask`` [n_layer, n_head] of ones with zeros at the given (layer, head) pairs.

    Pass it to ``model(idx, head_mask=...)``, ``model.loss`` or ``model.hidden_states``.
    """
    cfg = model.cfg
    mask = torch.ones(cfg.n_layer, cfg.n_head, device=model.tok_emb.weight.device)
    for pair in heads:
        mask[check_head(model, pair)] = 0.0
    return mask


def check_head(model: GPT, pair: Sequence[int]) -> tuple[int, int]:
    """(layer, head) as ints, or a ValueError naming the pair and the model's ranges."""
    cfg = model.cfg
    try:
        layer, head = (operator.index(v) for v in pair)
    except (TypeError, ValueError):
        layer = head = -1
    if not (0 <= layer < cfg.n_layer and 0 <= head < cfg.n_head):
        raise ValueError(f"head={pair!r} is invalid: expected "
                         f"[layer, head] with 0 <= layer < {cfg.n_layer} and 0 <= head < {cfg.n_head}")
    return layer, head


@torch.no_grad()
def mean_loss(model: GPT, batches: Sequence[Batch], head_mask: torch.Tensor | None = None) -> float:
    """Mean next-token loss in nats over every target of ``batches``."""
    _check_batches(batches)
    total, count = 0.0, 0
    for x, y in batches:
        total += float(model.loss(x, y, reduction="sum", head_mask=head_mask))
        count += y.numel()
    return total / count


@torch.no_grad()
def attention_maps(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    """idx [B, T] -> attention weights [B, n_layer, n_head, T, T] (query, key), from the slow path."""
    _, weights = model.attention_maps(idx)
    return torch.stack(weights, dim=1)


# ---------------------------------------------------------------------------------------------------------
# Statistics and kinds


def delimiter_ids(tokenizer) -> list[int]:
    """Ids whose decoded string is punctuation/newlines (and spaces) only, plus special tokens."""
    special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
    ids = range(tokenizer.get_vocab_size())
    texts = tokenizer.decode_batch([[i] for i in ids], skip_special_tokens=False)
    return [i for i, text in zip(ids, texts, strict=True) if i in special or _is_delimiter(text)]


def _is_delimiter(text: str) -> bool:
    marks = [c for c in text if c == "\n" or not c.isspace()]
    return bool(marks) and all(c == "\n" or unicodedata.category(c).startswith("P") for c in marks)


def query_statistics(weights: torch.Tensor, is_delimiter: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-query statistics of one layer's weights [B, H, T, T] -> each [B, H, T - FIRST_QUERY].

    ``is_delimiter`` [B, T] marks the delimiter keys. Entropy is in nats.
    """
    T = weights.shape[-1]
    if T <= FIRST_QUERY:
        raise ValueError(f"seq_len={T} is too short for head statistics: must be above {FIRST_QUERY}")
    i = torch.arange(T, device=weights.device)
    offset = (i[:, None] - i[None, :]).clamp(min=0).to(weights.dtype)  # [T, T]: query - key, 0 above
    entropy = -torch.special.xlogy(weights, weights).sum(-1)  # [B, H, T]; masked keys weigh exactly 0
    q = slice(FIRST_QUERY, None)
    return {
        "entropy": entropy[..., q],
        "normalized_entropy": entropy[..., q] / torch.log(i[q] + 1.0),  # query i sees i + 1 keys
        "mean_offset": (weights * offset).sum(-1)[..., q],
        "prev_token_mass": torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1)[..., FIRST_QUERY - 1:],
        "first_token_mass": weights[..., q, 0],
        "current_token_mass": torch.diagonal(weights, dim1=-2, dim2=-1)[..., q],
        "delimiter_mass": (weights * is_delimiter[:, None, None, :]).sum(-1)[..., q],
    }


def classify_head(stats: Mapping[str, float]) -> str:
    """A head's kind from its statistics; the first rule that matches wins (thresholds above)."""
    for kind, mass in (("first_token", "first_token_mass"), ("previous_token", "prev_token_mass"),
                       ("current_token", "current_token_mass")):
        if stats[mass] >= POSITIONAL_MASS:
            return kind
    if stats["delimiter_mass"] >= DELIMITER_MASS:
        return "delimiter"
    if stats["mean_offset"] <= LOCAL_MAX_OFFSET:
        return "local"
    if stats["normalized_entropy"] >= BROAD_MIN_ENTROPY:
        return "broad"
    return "mixed"


@torch.no_grad()
def head_statistics(model: GPT, batches: Sequence[Batch], delimiters: Iterable[int] = ()) -> list[dict]:
    """One record per head, layer-major: layer, head, kv_group, kind and the mean ``STATISTICS``."""
    _check_batches(batches)
    cfg = model.cfg
    sums = torch.zeros(len(STATISTICS), cfg.n_layer, cfg.n_head, dtype=torch.float64)
    delimiter_set = torch.tensor(sorted(set(delimiters)), dtype=torch.int64)
    queries = 0
    for x, _ in batches:
        is_delimiter = torch.isin(x, delimiter_set.to(x.device))  # [B, T]
        _, weights = model.attention_maps(x)
        for layer, w in enumerate(weights):
            stats = query_statistics(w, is_delimiter)
            sums[:, layer] += torch.stack([stats[name].sum(dim=(0, 2)) for name in STATISTICS]).double().cpu()
        queries += x.shape[0] * (x.shape[1] - FIRST_QUERY)
    means = sums / queries  # [n_stats, n_layer, n_head]
    group = cfg.n_head // cfg.n_kv_head
    records = []
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            stats = {name: float(means[k, layer, head]) for k, name in enumerate(STATISTICS)}
            records.append({"layer": layer, "head": head, "kv_group": head // group,
                            "kind": classify_head(stats), **stats})
    return records


# ---------------------------------------------------------------------------------------------------------
# Importance and pruning


def ablation_importance(model: GPT, batches: Sequence[Batch]) -> torch.Tensor:
    """Validation loss increase (nats/token) when each head alone is masked: [n_layer, n_head]."""
    cfg = model.cfg
    base = mean_loss(model, batches)
    importance = torch.zeros(cfg.n_layer, cfg.n_head, dtype=torch.float64)
    for layer in range(cfg.n_layer):
        for head in range(cfg.n_head):
            importance[layer, head] = mean_loss(model, batches, prune_heads(model, [(layer, head)])) - base
    return importance


def gradient_importance(model: GPT, batches: Sequence[Batch]) -> torch.Tensor:
    """Michel et al. 2019's proxy |dL/d head_mask| at head_mask = 1, averaged over batches."""
    _check_batches(batches)
    total = torch.zeros(model.cfg.n_layer, model.cfg.n_head, dtype=torch.float64)
    with torch.enable_grad():
        for x, y in batches:
            mask = prune_heads(model, []).requires_grad_()
            # Gradient for the mask only: autograd skips every weight gradient.
            (grad,) = torch.autograd.grad(model.loss(x, y, head_mask=mask), mask)
            total += grad.abs().double().cpu()
    return total / len(batches)


IMPORTANCE: dict[str, Callable[[GPT, Sequence[Batch]], torch.Tensor]] = {
    "ablation": ablation_importance,
    "gradient": gradient_importance,
}


def least_important(importance: torch.Tensor, fraction: float,
                    scope: str = "global") -> list[tuple[int, int]]:
    """The (layer, head) pairs to prune: the lowest ``fraction`` of all heads, or of every layer.

    Ties break by (layer, head), so a given importance always gives the same heads.
    """
    check_choice("pruning", "scope", scope, PRUNE_SCOPES)
    if not 0.0 <= fraction <= 1.0:
        fail("pruning", "fraction", fraction, "must be in [0, 1]")
    n_layer, n_head = importance.shape
    heads = sorted((float(importance[l, h]), l, h) for l in range(n_layer) for h in range(n_head))
    if scope == "global":
        return [(l, h) for _, l, h in heads[:round(fraction * n_layer * n_head)]]
    per_layer = round(fraction * n_head)
    chosen = []
    for layer in range(n_layer):
        chosen += [(l, h) for _, l, h in heads if l == layer][:per_layer]
    return chosen


def pruning_curve(model: GPT, batches: Sequence[Batch], importance: torch.Tensor, *, scope: str = "global",
                  steps: int = 10) -> list[dict]:
    """Validation loss with the least important heads masked, at fractions 0, 1/steps, ..., 1.

    Fractions that round to the same heads are evaluated once. Each row: ``pruned`` (heads),
    ``fraction`` (pruned / all heads), ``loss``, ``loss_increase`` over the unpruned model, ``heads``.
    """
    check_positive_int("pruning", "steps", steps)
    n_heads = importance.numel()
    rows: list[dict] = []
    for step in range(steps + 1):
        heads = least_important(importance, step / steps, scope)
        if rows and len(heads) == rows[-1]["pruned"]:
            continue
        loss = mean_loss(model, batches, prune_heads(model, heads))
        rows.append({"pruned": len(heads), "fraction": len(heads) / n_heads, "loss": loss,
                     "loss_increase": loss - (rows[0]["loss"] if rows else loss),
                     "heads": [list(pair) for pair in heads]})
    return rows


def _check_batches(batches: Sequence[Batch]) -> None:
    if not batches:
        raise ValueError("batches is empty: head analysis needs at least one (x, y) validation batch")


# ---------------------------------------------------------------------------------------------------------
# Plots and tables


def token_labels(tokenizer, ids: Sequence[int]) -> list[str]:
    """Each id decoded on its own, with newlines shown as \\n and '$' escaped from matplotlib's mathtext."""
    texts = tokenizer.decode_batch([[int(i)] for i in ids], skip_special_tokens=False)
    return [text.replace("\n", "\\n").replace("$", r"\$") for text in texts]


def plot_attention_grid(maps: torch.Tensor, path: str | Path, titles: Sequence[str] | None = None) -> Figure:
    """One panel per layer (rows) x head (columns) of maps [n_layer, n_head, T, T]; colours per panel."""
    n_layer, n_head = maps.shape[:2]
    fig = Figure(figsize=(1.8 * n_head + 0.4, 1.8 * n_layer + 0.4), layout="constrained")
    axes = fig.subplots(n_layer, n_head, squeeze=False)
    for layer in range(n_layer):
        for head in range(n_head):
            ax = axes[layer, head]
            ax.imshow(maps[layer, head].cpu().numpy(), cmap="viridis", interpolation="nearest")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(titles[layer * n_head + head] if titles else f"L{layer} H{head}", fontsize=7)
    fig.savefig(path, dpi=110)
    return fig


def plot_attention_head(weights: torch.Tensor, path: str | Path, title: str,
                        tokens: Sequence[str] | None = None) -> Figure:
    """One head's weights [T, T] at full size, axes labelled with the tokens when T is small enough."""
    T = weights.shape[-1]
    fig = Figure(figsize=(9, 8), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(weights.cpu().numpy(), cmap="viridis", interpolation="nearest")
    fig.colorbar(image, ax=ax, shrink=0.8, label="attention weight")
    if tokens is not None and T <= MAX_LABELLED_TOKENS:
        ax.set_xticks(range(T), tokens, rotation=90, fontsize=6)
        ax.set_yticks(range(T), tokens, fontsize=6)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(title)
    fig.savefig(path, dpi=150)
    return fig


def plot_importance(heads: Sequence[Mapping[str, Any]], n_layer: int, n_head: int, path: str | Path,
                    method: str) -> Figure:
    """Importance as a layer x head heatmap, each cell annotated with the head's kind."""
    grid = torch.zeros(n_layer, n_head)
    for record in heads:
        grid[record["layer"], record["head"]] = record["importance"]
    fig = Figure(figsize=(1.3 * n_head + 2, 0.8 * n_layer + 1.2), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(grid.numpy(), cmap="magma", aspect="auto")
    fig.colorbar(image, ax=ax, label=f"importance ({method})")
    middle = float(grid.min() + grid.max()) / 2
    for record in heads:  # dark text on the bright cells of magma, light text on the dark ones
        ax.text(record["head"], record["layer"], f"{record['kind']}\n{record['importance']:.3g}", ha="center",
                va="center", fontsize=7, color="black" if record["importance"] > middle else "white")
    ax.set_xticks(range(n_head))
    ax.set_yticks(range(n_layer))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    fig.savefig(path, dpi=120)
    return fig


def plot_pruning(curve: Sequence[Mapping[str, Any]], path: str | Path, scope: str, method: str) -> Figure:
    """Validation loss against the fraction of heads pruned, with the unpruned loss as a line."""
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    ax.plot([r["fraction"] for r in curve], [r["loss"] for r in curve], marker="o")
    ax.axhline(curve[0]["loss"], color="gray", linestyle="--", label="unpruned")
    ax.set_xlabel(f"fraction of heads pruned ({scope}, by {method} importance)")
    ax.set_ylabel("validation loss (nats/token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=120)
    return fig


def format_heads_table(heads: Sequence[Mapping[str, Any]]) -> str:
    """The per-head records as a Markdown table."""
    lines = ["| layer | head | kind | entropy | mean offset | prev | first | delim | importance |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['layer']} | {r['head']} | {r['kind']} | {r['entropy']:.2f} | {r['mean_offset']:.1f} | "
              f"{r['prev_token_mass']:.2f} | {r['first_token_mass']:.2f} | {r['delimiter_mass']:.2f} | "
              f"{r['importance']:.4f} |" for r in heads]
    return "\n".join(lines)


def format_pruning_table(curve: Sequence[Mapping[str, Any]]) -> str:
    """The pruning curve as a Markdown table."""
    lines = ["| heads pruned | fraction | val loss | increase |", "|---:|---:|---:|---:|"]
    lines += [f"| {r['pruned']} | {r['fraction']:.2f} | {r['loss']:.4f} | {r['loss_increase']:+.4f} |"
              for r in curve]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# The whole analysis (scripts/analyze_heads.py)


@dataclass
class HeadAnalysisConfig:
    """What ``analyze_heads`` reads and writes; configs/analyze_heads.yaml mirrors it."""

    ckpt: str | None = None  # a checkpoint directory or a run directory (then its latest checkpoint)
    out_dir: str | None = None  # None: <checkpoint>/heads
    data_dir: str | None = None  # None: the run's config.yaml data.root/data.name, else data/shakespeare
    text: str | None = None  # text for the attention maps; None: the first map_len validation tokens
    map_len: int = 64
    head: list[int] | None = None  # [layer, head]: also draw that head's map at full size
    seq_len: int | None = None  # window length for statistics and importance; None: the training length
    batch_size: int = 8
    n_batches: int = 8
    importance: str = "ablation"  # ablation | gradient
    prune_scope: str = "global"  # global | layer
    prune_steps: int = 10  # pruning fractions 0, 1/steps, ..., 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        own = "analyze_heads"
        if not isinstance(self.ckpt, str) or not self.ckpt:
            fail(own, "ckpt", self.ckpt, "required: a checkpoint or run directory (ckpt=runs/...)")
        for name in ("map_len", "batch_size", "n_batches", "prune_steps"):
            check_positive_int(own, name, getattr(self, name))
        if self.seq_len is not None:
            check_positive_int(own, "seq_len", self.seq_len)
            if self.seq_len <= FIRST_QUERY:
                fail(own, "seq_len", self.seq_len, f"must be above {FIRST_QUERY}")
        if self.text is not None and (not isinstance(self.text, str) or not self.text):
            fail(own, "text", self.text, "must be a non-empty string or null")
        if self.head is not None and (not isinstance(self.head, (list, tuple)) or len(self.head) != 2):
            fail(own, "head", self.head, "must be [layer, head] or null")
        check_choice(own, "importance", self.importance, tuple(IMPORTANCE))
        check_choice(own, "prune_scope", self.prune_scope, PRUNE_SCOPES)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> HeadAnalysisConfig:
        return from_dict(cls, values, owner="analyze_heads")


def resolve_data_dir(ckpt: str | Path, explicit: str | None = None) -> Path:
    """``explicit``, else the training run's ``config.yaml`` data folder, else ``DEFAULT_DATA_DIR``.

    The run directory is ``ckpt`` itself or the parent of its ``checkpoints/`` folder. A relative
    ``data.root`` is taken from the current directory, as training took it.
    """
    if explicit is not None:
        return Path(explicit)
    for run_dir in (Path(ckpt), resolve_checkpoint(ckpt).parent.parent):
        config = run_dir / "config.yaml"
        if config.is_file():
            data = (yaml.safe_load(config.read_text()) or {}).get("data") or {}
            if data.get("root") and data.get("name"):
                return data_dir(DataConfig(root=data["root"], name=data["name"]))
    return Path(DEFAULT_DATA_DIR)


def analyze_heads(cfg: HeadAnalysisConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Statistics, importance, pruning and attention maps of a checkpoint; writes them to ``out_dir``.

    Files: heads.json, attention_maps.png, importance.png, pruning.png and, with ``cfg.head``,
    attention_L<layer>H<head>.png. Returns the heads.json content.
    """
    ckpt = load_checkpoint(cfg.ckpt, device=cfg.device)
    model = ckpt.model.eval()
    focus = check_head(model, cfg.head) if cfg.head is not None else None
    data = TokenData(resolve_data_dir(cfg.ckpt, cfg.data_dir))
    if data.vocab_size > ckpt.config.vocab_size:
        raise ValueError(f"data_dir={str(data.data_dir)!r} has vocab_size={data.vocab_size}, more than the "
                         f"model's {ckpt.config.vocab_size}: pass the data the checkpoint was trained on")
    tokenizer = ckpt.tokenizer or data.tokenizer
    seq_len = cfg.seq_len or ckpt.train_seq_len
    batches = [(x.to(cfg.device), y.to(cfg.device))
               for x, y in data.val_batches(cfg.n_batches, batch_size=cfg.batch_size, seq_len=seq_len)]
    out_dir = Path(cfg.out_dir) if cfg.out_dir is not None else ckpt.path / "heads"
    out_dir.mkdir(parents=True, exist_ok=True)
    log(f"{ckpt.path}: {ckpt.config.n_layer} layers x {ckpt.config.n_head} heads "
        f"({ckpt.config.n_kv_head} kv), {len(batches) * cfg.batch_size} validation windows of {seq_len} "
        f"tokens from {data.data_dir}")

    heads = head_statistics(model, batches, delimiter_ids(tokenizer))
    importance = IMPORTANCE[cfg.importance](model, batches)
    for record in heads:
        record["importance"] = float(importance[record["layer"], record["head"]])
    curve = pruning_curve(model, batches, importance, scope=cfg.prune_scope, steps=cfg.prune_steps)

    if cfg.text is not None:
        ids = tokenizer.encode(cfg.text).ids
    else:
        ids = data.tokens("val")[:cfg.map_len].tolist()
    if not ids:
        raise ValueError(f"text={cfg.text!r} encodes to no tokens: give some text for the attention maps")
    maps = attention_maps(model, torch.tensor([ids], device=cfg.device))[0]  # [n_layer, n_head, T, T]
    plot_attention_grid(maps, out_dir / "attention_maps.png",
                        [f"L{r['layer']} H{r['head']} {r['kind']}" for r in heads])
    if focus is not None:
        kind = heads[focus[0] * ckpt.config.n_head + focus[1]]["kind"]
        plot_attention_head(maps[focus], out_dir / f"attention_L{focus[0]}H{focus[1]}.png",
                            f"layer {focus[0]} head {focus[1]} ({kind})", token_labels(tokenizer, ids))
    plot_importance(heads, ckpt.config.n_layer, ckpt.config.n_head, out_dir / "importance.png",
                    cfg.importance)
    plot_pruning(curve, out_dir / "pruning.png", cfg.prune_scope, cfg.importance)

    report = {
        "checkpoint": str(ckpt.path), "step": ckpt.step, "data_dir": str(data.data_dir),
        "windows": {"count": len(batches) * cfg.batch_size, "seq_len": seq_len},
        "importance_method": cfg.importance, "prune_scope": cfg.prune_scope, "base_loss": curve[0]["loss"],
        "thresholds": {"first_query": FIRST_QUERY, "positional_mass": POSITIONAL_MASS,
                       "delimiter_mass": DELIMITER_MASS, "local_max_offset": LOCAL_MAX_OFFSET,
                       "broad_min_entropy": BROAD_MIN_ENTROPY},
        "heads": heads, "pruning": curve,
    }
    (out_dir / "heads.json").write_text(json.dumps(report, indent=1) + "\n")
    log(format_heads_table(heads))
    log(format_pruning_table(curve))
    log(f"wrote {out_dir}/heads.json and plots")
    return report
