"""Claims decided only with the power to decide them: the minimum detectable effect and the seeds it
would take, "not testable at this scale", degradation beside level, premises, positive controls, and
rate intervals that stay in [0, 1]. References: Student t's quantiles in closed form at 2 degrees of
freedom, and each rule written out on a handful of seeds."""

from __future__ import annotations

import math
import statistics

import pytest

from nanoattn.eval.claims import Claim, Measure, Premise, detectable, judge, rate_interval, seeds_needed
from nanoattn.eval.results import record, render_page


def t2(p: float) -> float:
    """Student t's quantile p at 2 degrees of freedom, in closed form."""
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def rows(**values) -> list[dict]:
    return [{"label": label, "status": None, "values": columns} for label, columns in values.items()]


def test_the_minimum_detectable_effect_is_the_paired_spread_times_the_two_quantiles():
    assert detectable(0.3, 3) == pytest.approx((t2(0.975) + t2(0.8)) * 0.3 / math.sqrt(3), rel=1e-9)
    spread, effect = 0.05, 0.03
    n = seeds_needed(spread, effect)
    assert detectable(spread, n) <= effect < detectable(spread, n - 1)
    assert seeds_needed(1.0, 1e-6) is None  # no number of seeds this side of the limit


def test_an_effect_below_what_the_lab_detects_is_not_testable_with_the_seeds_it_would_take():
    # Paired log ratios of about 2 % with a spread of about 2.4 %: an effect of 1 % is out of reach.
    claim = Claim("P", "a beats b", "ppl", "a", "b", effect=0.01, control=True)
    [found] = judge([claim], rows(a={"ppl": [100.0, 100.0, 100.0]}, b={"ppl": [101.0, 105.0, 100.5]}),
                    Measure())
    differences = [math.log(w / 100) for w in (101.0, 105.0, 100.5)]
    assert found["mde"] == pytest.approx(detectable(statistics.stdev(differences), 3))
    needed = seeds_needed(statistics.stdev(differences), math.log1p(0.01))
    assert found["verdict"] == f"not testable at this scale (needs about {needed} seeds at this spread)"
    # The same measurements decide a claim of a 10 % effect: the interval holds zero, excludes 10 %
    # (beside a positive control the lab reproduces: c beats b by far).
    bigger = Claim("P", "a beats b", "ppl", "a", "b", effect=0.10)
    control = Claim("Q", "c beats b", "ppl", "c", "b", effect=0.10, control=True)
    measured = rows(a={"ppl": [100.0, 100.0, 100.0]}, b={"ppl": [101.0, 105.0, 100.5]},
                    c={"ppl": [50.0, 52.0, 50.0]})
    found, _ = judge([bigger, control], measured, Measure())
    assert found["verdict"] == "disagrees (no effect of the paper's size: the interval excludes it)"


def test_an_interval_holding_zero_and_the_papers_effect_is_inconclusive():
    # Paired log ratios 0.10, 0.02, 0.06: the interval (-0.04, 0.16) holds 0 and the paper's 0.13, whose
    # size this spread can detect (0.124).
    claim = Claim("P", "a beats b", "ppl", "a", "b", effect=math.expm1(0.13), control=True)
    b = [100 * math.exp(d) for d in (0.10, 0.02, 0.06)]
    [found] = judge([claim], rows(a={"ppl": [100.0] * 3}, b={"ppl": b}), Measure())
    assert found["mde"] < 0.13 < found["difference"]["high"] and found["difference"]["low"] < 0
    assert found["verdict"] == "inconclusive"


def test_an_advantage_wholly_below_the_papers_effect_agrees_in_direction_only():
    # Paired log ratios 0.05, 0.06, 0.07: the interval (0.035, 0.085) is above zero and below the
    # paper's 0.5, so the direction reproduces and the size does not; a 6 % paper effect agrees.
    b = [100 * math.exp(d) for d in (0.05, 0.06, 0.07)]
    measured = rows(a={"ppl": [100.0] * 3}, b={"ppl": b})
    large = Claim("P", "a beats b", "ppl", "a", "b", effect=math.expm1(0.5), control=True)
    assert judge([large], measured, Measure())[0]["verdict"] == (
        "agrees in direction, smaller than the paper's effect (the interval excludes its size)")
    close = Claim("P", "a beats b", "ppl", "a", "b", effect=math.expm1(0.06), control=True)
    assert judge([close], measured, Measure())[0]["verdict"] == "agrees"


def test_a_lab_disagrees_only_beside_a_positive_control_it_reproduces():
    measured = rows(a={"ppl": [110.0, 120.0, 130.0]}, b={"ppl": [100.0, 110.0, 120.0]},
                    c={"ppl": [90.0, 100.0, 110.0]})
    worse = Claim("P", "a beats b", "ppl", "a", "b", effect=0.05)
    control = Claim("Q", "c beats b", "ppl", "c", "b", effect=0.05, control=True)
    assert judge([worse], measured, Measure())[0]["verdict"].startswith(
        "not testable at this scale (it has no positive control")
    assert judge([worse, control], measured, Measure())[0]["verdict"] == "disagrees"
    failed = Claim("Q", "c beats b", "ppl", "b", "c", effect=0.05, control=True)
    found = judge([worse, failed], measured, Measure())
    assert [f["verdict"].split(" (")[0] for f in found] == ["not testable at this scale"] * 2
    assert "its positive control did not reproduce" in found[0]["verdict"]


def test_a_length_claim_compares_degradation_and_the_page_shows_it_beside_the_level():
    # a is better at 16x only because it is better at 1x: it degrades more.
    values = {"a": {"ppl 1x": [50.0, 52.0, 51.0], "ppl 16x": [100.0, 105.0, 101.0]},
              "b": {"ppl 1x": [80.0, 81.0, 82.0], "ppl 16x": [120.0, 122.0, 121.0]}}
    level = Claim("P", "a at 16x", "ppl 16x", "a", "b", effect=0.1, control=True)
    change = Claim("P", "a degrades less", "ppl 16x", "a", "b", degradation=True, effect=0.1)
    page = record("demo", "Demo", "About.", [0, 1, 2], values, claims=[level, change], command="x")
    assert [f["verdict"] for f in page["findings"]] == ["agrees", "disagrees"]
    assert page["findings"][1]["column"] == "ppl 16x / 1x"
    a = next(row for row in page["rows"] if row["label"] == "a")
    assert a["values"]["ppl 16x / 1x"] == [2.0, pytest.approx(105 / 52), pytest.approx(101 / 51)]
    assert "| ppl 16x | ppl 16x / 1x |" in render_page(page)


def test_a_paper_without_a_number_is_agreed_with_in_direction_at_most():
    claim = Claim("P", "a beats b", "ppl", "a", "b", control=True)
    better = rows(a={"ppl": [10.0, 20.0, 30.0]}, b={"ppl": [11.0, 22.0, 33.0]})
    assert judge([claim], better, Measure())[0]["verdict"] == (
        "agrees in direction (the paper reports no size to compare)")
    worse = rows(a={"ppl": [11.0, 22.0, 33.0]}, b={"ppl": [10.0, 20.0, 30.0]})
    assert judge([claim], worse, Measure())[0]["verdict"].startswith("not testable at this scale (the paper "
                                                                     "reports no effect size")


def test_a_claim_whose_premise_is_absent_here_says_so():
    premise = Premise("base", "ppl 4x / 1x", 2.0, "RoPE's perplexity rises past its training length")
    claim = Claim("Chen 2023", "PI at 4x beats RoPE", "ppl 4x", "pi", "base", premise=premise, effect=0.5,
                  control=True)
    measured = rows(pi={"ppl 1x": [80.0, 81.0, 79.0], "ppl 4x": [90.0, 91.0, 95.0]},
                    base={"ppl 1x": [76.0, 77.0, 78.0], "ppl 4x": [80.0, 82.0, 83.0]})
    [found] = judge([claim], measured, Measure())
    assert found["verdict"].startswith("premise absent here: RoPE's perplexity rises past its training "
                                       "length (here 1.0")


@pytest.mark.parametrize("values", [[0.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [0.327, 0.0, 0.95],
                                    [0.9, 0.95, 0.99]])
def test_a_rate_interval_stays_in_zero_one_and_holds_the_mean(values):
    summary = rate_interval(values, 400)
    assert 0 <= summary["low"] <= summary["mean"] <= summary["high"] <= 1


def test_a_rate_interval_is_students_t_on_the_logit_of_the_rates_moved_half_an_instance_inward():
    values, m = [0.25, 0.5, 0.75], 4  # k = 1, 2, 3 of 4
    logits = [math.log((k + 0.5) / (m - k + 0.5)) for k in (1, 2, 3)]
    half = t2(0.975) * statistics.stdev(logits) / math.sqrt(3)
    center = statistics.fmean(logits)
    summary = rate_interval(values, m)
    assert summary["low"] == pytest.approx(1 / (1 + math.exp(-(center - half))))
    assert summary["high"] == pytest.approx(1 / (1 + math.exp(-(center + half))))
