"""Results pages: intervals over seeds, claims decided by them, and a page rendered from its record."""

from __future__ import annotations

import json
import math
import re
import subprocess

import pytest

from nanoattn.eval import results
from nanoattn.eval.claims import Claim, interval
from nanoattn.eval.results import number, record, render_page, write_page

# Student's t quantile for a two-sided 95% interval with 2 degrees of freedom, in closed form:
# with 2 degrees of freedom t_p = (2p - 1) / sqrt(2 p (1 - p)).
T_975_DF2 = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)


def test_the_interval_is_students_t_over_the_seeds():
    summary = interval([1.0, 2.0, 3.0])  # mean 2, sample standard deviation 1
    half = T_975_DF2 / math.sqrt(3)
    assert summary["mean"] == 2.0 and summary["n"] == 3
    assert summary["low"] == pytest.approx(2 - half, rel=1e-12) and summary["high"] == pytest.approx(2 + half)
    assert interval([5.0]) == {"mean": 5.0, "low": None, "high": None, "n": 1}  # no interval from one seed
    assert interval([])["mean"] is None


def page(better, worse, status=None, lower_is_better=True):
    """A record of rows a and b, the claim that a beats b first; c beats b by far in every seed, the
    positive control that lets the lab disagree."""
    claim = Claim("Paper 2024", "a beats b", "ppl", "a", "b", lower_is_better, effect=0.5)
    control = Claim("Control 2020", "c beats b", "ppl", "c", "b", lower_is_better, effect=0.5, control=True)
    control_values = [None if w is None else w * (0.5 if lower_is_better else 2) for w in worse]
    return record("demo", "Demo", "About.", [0, 1, 2],
                  {"a": {"ppl": better}, "b": {"ppl": worse}, "c": {"ppl": control_values}},
                  claims=[claim, control], status=status, command="python scripts/demo.py")


def test_a_claim_is_decided_by_paired_differences_over_the_seeds():
    # The seeds differ a lot from each other, the pairs little: pairing is what makes it decidable.
    agree = page([10.0, 20.0, 30.0], [10.5, 21.0, 31.5])["findings"][0]
    assert agree["verdict"].startswith("agrees in direction, smaller than the paper's effect")
    assert math.expm1(agree["difference"]["mean"]) == pytest.approx(0.05)
    assert page([10.5, 21.0, 31.5], [10.0, 20.0, 30.0])["findings"][0]["verdict"] == "disagrees"
    # Near zero, with the power to see the paper's 50 %: no effect of its size.
    assert page([10.0, 20.0, 30.0], [10.5, 19.5, 30.1])["findings"][0]["verdict"].startswith(
        "disagrees (no effect of the paper's size")
    # Higher is better (accuracy): the sign turns.
    accuracy = page([0.9, 0.8, 0.95], [0.5, 0.4, 0.6], lower_is_better=False)["findings"][0]
    assert accuracy["verdict"] == "agrees"
    # A seed one row did not measure leaves the pair out; a row with a status is never judged.
    partial = page([10.0, None, 30.0], [10.5, 20.4, 30.6])["findings"][0]
    assert partial["difference"]["n"] == 2
    held = page([10.0, 20.0, 30.0], [10.5, 20.4, 30.6], status={"b": "not learned (0.10 at 1x)"})
    assert held["findings"][0]["verdict"] == "inconclusive (not learned (0.10 at 1x))"


def test_a_record_keeps_every_seed_and_refuses_a_row_of_the_wrong_length():
    rec = page([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert rec["seeds"] == [0, 1, 2] and rec["rows"][0]["values"] == {"ppl": [1.0, 2.0, 3.0]}
    assert rec["machine"]["threads"] >= 1 and rec["machine"]["torch"] and rec["date"]
    assert rec["command"] == "python scripts/demo.py" and "commit" in rec and "dirty" in rec
    with pytest.raises(ValueError, match="row 'a' has 2 values of 'ppl' for 3 seeds"):
        record("demo", "Demo", "About.", [0, 1, 2], {"a": {"ppl": [1.0, 2.0]}})


def test_the_page_is_rendered_from_its_json_alone(tmp_path):
    rec = page([1.0, 2.0, 3.0], [1.5, 2.5, 3.5], status={"b": "unfinished: seed 2 at step 5 of 10"})
    md = write_page(tmp_path, rec, figure=lambda path: path.write_bytes(b"png"))
    saved = json.loads((tmp_path / "demo.json").read_text())
    assert md.read_text() == render_page(saved) and (tmp_path / "demo.png").read_bytes() == b"png"
    text = md.read_text()
    assert "python scripts/demo.py" in text and "![Demo](demo.png)" in text
    half = T_975_DF2 / math.sqrt(3)
    assert f"| a |  | 2 ± {half:.3g} |" in text  # mean ± the interval's half-width
    assert "| b | unfinished: seed 2 at step 5 of 10 | — |" in text  # a status replaces the numbers
    assert not list(tmp_path.glob(".lock*"))


def test_a_page_replaces_only_an_earlier_page_of_its_name(tmp_path):
    rec = page([1.0, 2.0, 3.0], [1.5, 2.5, 3.5])
    write_page(tmp_path, rec)
    write_page(tmp_path, rec, figure=lambda path: path.write_bytes(b"png"))  # its own: replaced
    other = tmp_path / "other"
    other.mkdir()
    (other / "demo.json").write_text('{"page": "bench"}')  # another page's name: not ours
    (other / "demo.md").write_text("notes")
    for folder, file, message in ((other, other / "demo.json", "exists and is not a results page (demo)"),
                                  (tmp_path / "new", tmp_path / "new" / "demo.md",
                                   "exists without a results page (demo) beside it")):
        folder.mkdir(exist_ok=True)
        (folder / "demo.md").write_text("notes")
        with pytest.raises(ValueError, match=re.escape(f"lab.out: {file} {message}")):
            write_page(folder, rec, key="lab.out")
        assert (folder / "demo.md").read_text() == "notes"


def test_a_number_keeps_the_digits_its_size_needs_and_a_count_stays_whole():
    assert [number(v) for v in (0.1234, 2.345, 123.45, 800.0, 12_345.6, None)] == [
        "0.123", "2.35", "123.5", "800", "12,346", "n/a"]


def test_a_checkout_is_dirty_for_changed_code_and_not_for_a_changed_results_page(tmp_path, monkeypatch):
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "docs" / "results" / "lab.md").write_text("a page\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "first")
    monkeypatch.setattr(results, "REPO", tmp_path)
    assert results.git_state()["dirty"] is False
    (tmp_path / "docs" / "results" / "lab.md").write_text("the page, published again\n")
    assert results.git_state()["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert results.git_state()["dirty"] is True
