"""Papers' claims checked against a lab's rows, spoken only where the lab has the power to decide them.

A claim says that row ``better`` beats row ``worse`` on ``column``. It is checked on the paired
comparison over the seeds both rows measured (each row's seeds share every setting but the seed):

- A relative measure for positive quantities (perplexities, logits): each seed's log(worse / better),
  shown as the percentage exp(.) - 1; an absolute one for rates in [0, 1] (exact match, retrieval):
  each seed's better - worse. The orientation makes the claimed side positive.
- With ``degradation``, each run's value is its change from the training length, column / 1x: a
  length claim then compares how much each row degrades, not its level at the long length, which
  carries its quality at 1x with it. The page shows both.
- Power first. From the paired spread s over n seeds, the minimum detectable effect is
  (t_0.975 + t_0.80) s / sqrt(n) (Student t, n - 1 degrees of freedom): the advantage a two-sided
  5% test finds four times in five. A claim whose paper reports an effect below it is "not testable
  at this scale", with the seeds that would detect the paper's effect at the measured spread (none
  when no number of seeds would: the spread of one seed's value then exceeds the paper's effect).
- Then the interval (Student t, 95%): above zero "agrees" (in direction only, said so, where it lies
  wholly below the paper's effect); below zero "disagrees"; holding zero but excluding the paper's
  effect "disagrees" too (no effect of the paper's size); else "inconclusive".
  Where the paper reports no number, an interval above zero "agrees in direction" and anything else
  is "not testable": with no size to detect, no power can be claimed.
- A premise the paper's claim rests on (PI extends a RoPE model whose perplexity rises past its
  training length) is checked on this lab's rows; absent here, the verdict says so and no more.
- A lab says "disagrees" only beside a positive control, a claim of its own marked ``control`` that
  agrees: otherwise it cannot tell a method's failure from its own (``judge``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

CONFIDENCE = 0.95
POWER = 0.80
MOST_SEEDS = 1000  # seeds_needed looks no further: past it a claim needs budget, not seeds


@dataclass(frozen=True)
class Premise:
    """What a paper's claim rests on, checked on this lab's row ``row``: its mean ``column`` is at
    least ``at_least`` (``text`` says it in words, for the page)."""

    row: str
    column: str
    at_least: float
    text: str


@dataclass(frozen=True)
class Claim:
    """A paper's claim that row ``better`` beats row ``worse`` on ``column``, with the paper's scale and
    the effect it reports (``effect``: a fraction for a relative measure, 0.05 = 5 % lower perplexity;
    the difference in the column's units for a rate), and where (``source``)."""

    paper: str
    statement: str
    column: str
    better: str
    worse: str
    lower_is_better: bool = True
    scale: str = ""
    effect: float | None = None
    source: str = ""
    degradation: bool = False  # compare column / 1x per run (a length claim)
    premise: Premise | None = None
    control: bool = False  # a positive control of its lab: a result the lab must reproduce


@dataclass(frozen=True)
class Measure:
    """How a column's values compare: ``rate`` columns are in [0, 1] with ``instances`` draws each."""

    rates: Mapping[str, int] = field(default_factory=dict)  # column -> instances behind each value

    def is_rate(self, column: str) -> bool:
        return column in self.rates


def interval(values: Sequence[float]) -> dict[str, Any]:
    """Mean and 95% interval (Student t) of ``values``; ``low``/``high`` are None below two values."""
    n = len(values)
    mean = statistics.fmean(values) if n else None
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    half = t_quantile(0.5 + CONFIDENCE / 2, n) * statistics.stdev(values) / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def rate_interval(values: Sequence[float], instances: int) -> dict[str, Any]:
    """Mean of rates in [0, 1] over the seeds and a 95% interval that stays in [0, 1]: Student t on the
    logit scale, each seed's rate first moved half an instance inward, (k + 1/2) / (m + 1) for k of m,
    so that 0 and 1 have a logit; the bounds mapped back. ``low``/``high`` None below two values."""
    n = len(values)
    mean = statistics.fmean(values) if n else None
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    logits = [math.log((v * instances + 0.5) / ((1 - v) * instances + 0.5)) for v in values]
    center = interval(logits)
    # Every seed at 0 (or 1) puts the bounds half an instance inside: widened to hold the mean.
    return {"mean": mean, "low": min(mean, _expit(center["low"])), "high": max(mean, _expit(center["high"])),
            "n": n}


def _expit(x: float) -> float:
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def t_quantile(p: float, n: int) -> float:
    """Student t's quantile ``p`` with n - 1 degrees of freedom (n seeds)."""
    from scipy import stats  # here, not at the top: every lab command would load scipy.stats at start

    return float(stats.t.ppf(p, n - 1))


def detectable(spread: float, n: int) -> float:
    """The minimum detectable effect of a paired comparison over n seeds of this spread."""
    return (t_quantile(0.5 + CONFIDENCE / 2, n) + t_quantile(POWER, n)) * spread / math.sqrt(n)


def seeds_needed(spread: float, effect: float) -> int | None:
    """The fewest seeds whose minimum detectable effect at ``spread`` is at most ``effect`` (None
    past ``MOST_SEEDS``)."""
    if spread == 0:
        return 2
    return next((n for n in range(2, MOST_SEEDS + 1) if detectable(spread, n) <= effect), None)


def cell_values(row: Mapping[str, Any], column: str, degradation: bool) -> list[float | None]:
    """A row's values of ``column`` per seed, or with ``degradation`` its change from 1x (column / 1x)."""
    values = row["values"].get(column)
    if values is None or not degradation:
        return values
    base = row["values"].get(f"{column.split()[0]} 1x")
    if base is None:
        return None
    return [v / b if v is not None and b else None for v, b in zip(values, base, strict=True)]


def degradation_column(column: str) -> str:
    """The name a page gives a length column's change from 1x: ``ppl 16x / 1x``."""
    return f"{column} / 1x"


def finding(claim: Claim, rows: Sequence[Mapping[str, Any]], measure: Measure) -> dict[str, Any]:
    """``claim`` checked on ``rows`` (see the module docstring); before the positive-control rule."""
    by_label = {row["label"]: row for row in rows}
    compared = degradation_column(claim.column) if claim.degradation else claim.column
    relative = not measure.is_rate(claim.column)
    result = {"paper": claim.paper, "statement": claim.statement, "column": compared, "better": claim.better,
              "worse": claim.worse, "paper_scale": claim.scale, "paper_effect": claim.effect,
              "source": claim.source, "measure": "relative" if relative else "absolute",
              "control": claim.control, "difference": None, "mde": None, "seeds_needed": None}
    pair = [by_label.get(claim.better), by_label.get(claim.worse)]
    values = [None if row is None else cell_values(row, claim.column, claim.degradation) for row in pair]
    if any(v is None for v in values):
        return {**result, "verdict": "not measured"}
    held = [row["status"] for row in pair if row["status"]]
    if held:
        return {**result, "verdict": f"inconclusive ({'; '.join(held)})"}
    sign = 1 if claim.lower_is_better else -1
    pairs = [(b, w) for b, w in zip(*values, strict=True) if b is not None and w is not None]
    if relative:
        differences = [sign * math.log(w / b) for b, w in pairs if b > 0 and w > 0]
    else:
        differences = [sign * (w - b) for b, w in pairs]
    difference = interval(differences)
    result["difference"] = difference
    if difference["low"] is None:
        return {**result, "verdict": "inconclusive (fewer than two seeds)"}
    spread = statistics.stdev(differences)
    effect = None if claim.effect is None else (math.log1p(claim.effect) if relative else claim.effect)
    mde = detectable(spread, len(differences))
    result.update(mde=mde, seeds_needed=None if effect is None else seeds_needed(spread, effect))
    if claim.premise is not None:
        premise_row = by_label.get(claim.premise.row)
        premise_values = [] if premise_row is None else [
            v for v in cell_values(premise_row, *_premise_column(claim.premise)) or [] if v is not None]
        mean = statistics.fmean(premise_values) if premise_values else None
        if mean is None or mean < claim.premise.at_least:
            shown = "not measured" if mean is None else f"{mean:.3g}"
            return {**result, "verdict": f"premise absent here: {claim.premise.text} (here {shown})"}
    if effect is None:  # the paper gives no number: only a measured advantage says anything
        if difference["low"] > 0:
            return {**result, "verdict": "agrees in direction (the paper reports no size to compare)"}
        return {**result, "verdict": "not testable at this scale (the paper reports no effect size to test "
                                     "against)"}
    if mde > effect:
        more = (f"needs about {result['seeds_needed']} seeds at this spread" if result["seeds_needed"]
                else "seeds alone would not: it needs a larger budget")
        return {**result, "verdict": f"not testable at this scale ({more})"}
    if difference["low"] > 0 and difference["high"] < effect:
        return {**result, "verdict": "agrees in direction, smaller than the paper's effect (the interval "
                                     "excludes its size)"}
    if difference["low"] > 0:
        return {**result, "verdict": "agrees"}
    if difference["high"] < 0:
        return {**result, "verdict": "disagrees"}
    if effect is not None and difference["high"] < effect:
        return {**result, "verdict": "disagrees (no effect of the paper's size: the interval excludes it)"}
    return {**result, "verdict": "inconclusive"}


def _premise_column(premise: Premise) -> tuple[str, bool]:
    """(column, degradation) of a premise stated on ``<column> / 1x``."""
    if premise.column.endswith(" / 1x"):
        return premise.column.removesuffix(" / 1x"), True
    return premise.column, False


def judge(claims: Sequence[Claim], rows: Sequence[Mapping[str, Any]],
          measure: Measure) -> list[dict[str, Any]]:
    """Every claim's finding; a "disagrees" stands only where a positive control of the lab agrees."""
    findings = [finding(claim, rows, measure) for claim in claims]
    controls = [f for f in findings if f["control"]]
    reproduced = any(f["verdict"].startswith("agrees") for f in controls)
    if not reproduced:
        why = ("its positive control did not reproduce" if controls else "it has no positive control")
        findings = [{**f, "verdict": f"not testable at this scale ({why}, so a failure here cannot be told "
                                     "from the instrument's)"}
                    if f["verdict"].startswith("disagrees") else f for f in findings]
    return findings


def advantage_text(difference: Mapping[str, Any] | None, measure: str) -> str:
    """A finding's advantage, ``mean ± half-width``: a percentage for a relative measure."""
    if difference is None or difference["mean"] is None:
        return "—"
    if measure == "relative":
        mean = 100 * math.expm1(difference["mean"])
        if difference["low"] is None:
            return f"{mean:+.1f} %"
        half = 100 * (math.expm1(difference["high"]) - math.expm1(difference["low"])) / 2
        return f"{mean:+.1f} ± {half:.1f} %"
    if difference["low"] is None:
        return f"{difference['mean']:+.3f}"
    return f"{difference['mean']:+.3f} ± {(difference['high'] - difference['low']) / 2:.3f}"


def mde_text(mde: float | None, measure: str) -> str:
    """A minimum detectable effect in the finding's units (a percentage for a relative measure)."""
    if mde is None:
        return "—"
    return f"{100 * math.expm1(mde):.1f} %" if measure == "relative" else f"{mde:.3f}"


def paper_effect_text(effect: float | None, measure: str) -> str:
    """The paper's effect as the claim states it: a fraction (relative) or a difference of rates."""
    if effect is None:
        return "—"
    return f"{100 * effect:.1f} %" if measure == "relative" else f"{effect:+.3f}"
