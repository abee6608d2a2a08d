"""Which registered options the project's published pages cover. An option registered after them (a
user's own encoding, added as the README's recipe shows) is "not yet covered": a check of a page or
table written by hand (the README catalogue, the reference table, a lab's page) skips it, saying what
to add, while every covered option is checked in full, and the generic tests (cached decoding, the
chunked bias, head analysis, memory) run on it as on any other."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

import pytest

REFERENCES = Path(__file__).resolve().parents[1] / "docs" / "results" / "references.json"


def covered() -> set[str]:
    """The options the published reference table has a row for: the project's own."""
    return {row["name"] for row in json.loads(REFERENCES.read_text())["rows"]}


def check_rows(needed: Iterable[str], present: Collection[str], where: str, what_to_add: str,
               option: Callable[[str], str | None] = lambda row: row) -> None:
    """Fail if ``where`` lacks a row of ``needed`` whose option (``option(row)``; None: a row of the
    project's own, such as an arithmetic lab's) is covered; skip, naming them, if it lacks rows only of
    options not yet covered. Call it last: the skip ends the test."""
    absent = [name for name in needed if name not in present]
    known = covered()
    lost = [name for name in absent if option(name) is None or option(name) in known]
    assert not lost, f"{where} has no row for {', '.join(lost)}: {what_to_add}"
    if absent:
        pytest.skip(f"not yet covered: {where} has no row for {', '.join(absent)} ({what_to_add})")
