"""The front door names everything that exists: every option of every registry, and every lab's page."""

from __future__ import annotations

import re
from pathlib import Path

from coverage import check_rows

from nanoattn.commands.labs import LABS
from nanoattn.config.options import ATTENTION_VARIANTS, RECIPES, encoding_options
from nanoattn.tasks import TASKS

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def catalogue_rows(heading: str) -> list[str]:
    """The first-column names of the table under ``heading`` in README.md."""
    section = README.split(heading, 1)[1].split("\n### ", 1)[0]
    return re.findall(r"^\| `([a-z0-9_]+)` \|", section, flags=re.MULTILINE)


def test_the_catalogue_has_one_row_per_encoding_and_attention_variant():
    encodings, variants = catalogue_rows("### Positional encodings"), catalogue_rows("### Attention variants")
    assert len(set(encodings)) == len(encodings) and set(encodings) <= set(encoding_options())
    assert len(set(variants)) == len(variants) and set(variants) <= set(ATTENTION_VARIANTS)
    check_rows([*encoding_options(), *ATTENTION_VARIANTS], {*encodings, *variants}, "the README catalogue",
               "add its row to the table of its kind in README.md")


def test_every_task_recipe_and_lab_page_is_named():
    for name in (*TASKS, *RECIPES):
        assert f"- `{name}`:" in README, name
    for lab in LABS:
        assert f"(docs/results/{lab}.md)" in README, lab
    assert "(docs/results/bench.md)" in README


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 300
    assert not re.search(r"20\d\d-\d\d-\d\d", README)  # dated measurements live on the results pages
