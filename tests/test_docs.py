"""The front door names everything that exists: every option of every registry, and every lab's page."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from coverage import check_rows

from nanoattn.commands.labs import (
    ARITHMETIC_ROWS,
    LABS,
    ArithmeticLabConfig,
    AttentionLabConfig,
    LabConfig,
    TaskLabConfig,
)
from nanoattn.commands.labs.driver import not_run
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


# Each lab's config at its defaults: its whole default set of rows.
LAB_CONFIGS = {"extrapolation": LabConfig(), "passkey": LabConfig(passkey=True),
               "attention": AttentionLabConfig(), "tasks": TaskLabConfig(),
               "task_budget": TaskLabConfig(calibrate="task_budget"),
               "addition_calibration": TaskLabConfig(calibrate="addition_calibration"),
               "arithmetic": ArithmeticLabConfig(),
               "control_budget": ArithmeticLabConfig(calibrate="control_budget")}


def row_option(label: str) -> str | None:
    """The registered option a lab row is about (``copy/nope`` and ``rope+yarn4``: nope, rope), None for
    a row of the lab's own (an arithmetic lab's ``coupling_paper``)."""
    name = label.rsplit("/", 1)[-1].split("+", 1)[0]
    return name if name in encoding_options() or name in ATTENTION_VARIANTS else None


@pytest.mark.parametrize("lab", sorted(LABS))
def test_a_published_page_has_every_row_of_its_lab_or_lists_it_as_not_run(lab):
    assert set(LAB_CONFIGS) == set(LABS)
    page = json.loads((REPO / "docs" / "results" / f"{lab}.json").read_text())
    ran = {row["label"] for row in page["rows"]}
    # What the page says was not run is what its rows lack at its own registries.
    assert not set(page.get("not_run", [])) & ran
    check_rows([row.label for row in LABS[lab].rows(LAB_CONFIGS[lab])], ran | set(page.get("not_run", [])),
               f"docs/results/{lab}.json", "run the lab, or judge its page again with values_from= to list "
               "the rows it lacks as not run", option=row_option)


def test_a_page_lists_the_default_rows_a_command_left_out():
    chosen = TaskLabConfig(tasks=["copy"], encodings=["nope"], variants=[])
    left_out = not_run(LABS["tasks"], chosen, {"copy/nope": {}})
    every = [row.label for row in LABS["tasks"].rows(TaskLabConfig())]
    assert left_out == [label for label in every if label != "copy/nope"] and "reverse/rope" in left_out
    assert not_run(LABS["arithmetic"], ArithmeticLabConfig(rows=["nope"]), {}) == list(ARITHMETIC_ROWS)


def test_the_readme_stays_a_front_door():
    assert len(README.splitlines()) <= 300
    assert not re.search(r"20\d\d-\d\d-\d\d", README)  # dated measurements live on the results pages


def test_the_training_page_lists_every_experiment():
    listed = (REPO / "docs" / "training.md").read_text().split("| `experiment=` |", 1)[1].split("\n", 1)[0]
    shipped = sorted(path.stem for path in (REPO / "configs" / "experiment").glob("*.yaml"))
    assert shipped and [name for name in shipped if f"`{name}`" not in listed] == []
