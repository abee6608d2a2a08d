"""Every encoding and attention variant equals its reference implementation within a float32
tolerance (the checks: nanoattn/references), every option has a row, and the published table
(docs/results/references.md) has every row, is within every tolerance and is its JSON rendered."""

from __future__ import annotations

import json

import pytest
from coverage import check_rows

from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.references.rows import ENCODING, ROWS, VARIANT
from nanoattn.references.table import FOLDER, PAGE, render

CASES = [(name, index) for name, row in ROWS.items() for index in range(len(row.checks))]
PUBLISHED = FOLDER / f"{PAGE}.json"
REGENERATE = "python scripts/reference_table.py"


def options() -> dict[str, str]:
    """Every option that needs a row, and its kind: read from the registries when asked."""
    return {**dict.fromkeys(encoding_options(), ENCODING), **dict.fromkeys(ATTENTION_VARIANTS, VARIANT)}


@pytest.mark.parametrize(("name", "index"), CASES, ids=[f"{name}-{index}" for name, index in CASES])
def test_each_option_equals_its_reference(name, index):
    check = ROWS[name].checks[index]
    assert check.measure() <= check.tolerance, check.reference


def test_every_encoding_and_attention_variant_has_a_row():
    for name in set(ROWS) & set(options()):
        assert ROWS[name].kind == options()[name] and ROWS[name].checks, name
    assert set(ROWS) <= set(options()), f"rows for no registered option: {sorted(set(ROWS) - set(options()))}"
    check_rows(options(), ROWS, "ROWS in nanoattn/references/rows.py",
               f"add its paper, reference and check there, then run {REGENERATE}")


def test_the_published_table_has_every_row_within_its_tolerance():
    page = json.loads(PUBLISHED.read_text())
    stated = [(row["name"], row["kind"], row["paper"], row["reference"], row["compared"], row["tolerance"],
               row["note"]) for row in page["rows"]]
    current = [(name, row.kind, row.paper, check.reference, check.compared, check.tolerance, check.note)
               for name, row in ROWS.items() for check in row.checks]
    assert stated == current, f"docs/results/references.md is not the table of ROWS: run {REGENERATE}"
    assert all(row["difference"] <= row["tolerance"] for row in page["rows"])
    assert render(page) == PUBLISHED.with_suffix(".md").read_text()
    check_rows(options(), {row["name"] for row in page["rows"]}, "docs/results/references.md", REGENERATE)
