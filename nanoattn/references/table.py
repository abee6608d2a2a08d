"""The published reference table: every check run once, rendered as a results page."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nanoattn.eval.results import header_lines, provenance, write_page
from nanoattn.eval.tables import format_table
from nanoattn.references.rows import ROWS

# ----------------------------------------------------------------------------- the published table

PAGE = "references"
FOLDER = Path(__file__).resolve().parents[2] / "docs" / "results"
ABOUT = ("Every positional encoding (`pos=`) and attention variant (`attention=`) of nanoattn against its "
         "paper: the reference implementation it is tested against, what is compared, and the largest "
         "difference measured, max |nanoattn - reference| / max(1, |reference|) over the compared entries "
         "(absolute below 1, relative above), on small seeded inputs in float32 on nanoattn's side. The "
         "tolerance is each check's own, which the test suite asserts; the checks, and the reason for each "
         "tolerance, are in `nanoattn/references/`. A note says where nanoattn and the reference differ "
         "by a convention, and how the check bridges it.")
COLUMNS = ("name", "kind", "paper", "reference", "compared", "largest difference", "tolerance", "note")


def measured() -> list[dict[str, Any]]:
    """Every check run once: one row per (option, reference)."""
    return [{"name": name, "kind": row.kind, "paper": row.paper, "reference": check.reference,
             "compared": check.compared, "difference": check.measure(), "tolerance": check.tolerance,
             "note": check.note}
            for name, row in ROWS.items() for check in row.checks]


def number(value: float) -> str:
    return "0" if value == 0 else f"{value:.1e}"


def render(page: Mapping[str, Any]) -> str:
    """The markdown page of a record: its header, then one table row per check."""
    def text(cell: str) -> str:
        return cell.replace("|", "\\|")  # a bar inside a cell would end it

    rows = ([f"`{r['name']}`", r["kind"], text(r["paper"]), text(r["reference"]), text(r["compared"]),
             number(r["difference"]) + ("" if r["difference"] <= r["tolerance"] else " (over the tolerance)"),
             number(r["tolerance"]), text(r["note"])] for r in page["rows"])
    table = format_table(COLUMNS, rows, "lllllrrl")
    return "\n".join([*header_lines(page), "", table.rstrip("\n")]) + "\n"


def publish(folder: str | Path = FOLDER) -> Path:
    """Run every check and write ``<folder>/references.{json,md}``; the markdown's path."""
    page = {**provenance(PAGE, "Reference implementations", ABOUT), "rows": measured()}
    return write_page(folder, page, render=render)
