"""Markdown tables: one way to format them and one way to put them into a markdown file.

Design choices:

- ``format_table`` takes the header and rows already as text (each caller chooses its number
  formats) and returns a block ending in a newline, so tables concatenate and print as they are.
- ``write_table`` replaces only the text between a table's ``<!-- name:begin/end -->`` markers,
  so the prose around a measured table survives a rerun, and several tables share one file.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

from nanoattn.runtime import write_atomic

ALIGN = {"l": "---", "r": "---:"}


def format_table(header: Sequence[str], rows: Iterable[Sequence[str]], align: str | None = None) -> str:
    """A markdown table; ``align`` has one ``l`` or ``r`` per column (default: first left, the rest right)."""
    align = align or "l" + "r" * (len(header) - 1)
    if len(align) != len(header) or set(align) - set(ALIGN):
        raise ValueError(f"align={align!r} is invalid: one 'l' or 'r' per column ({len(header)})")
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(ALIGN[a] for a in align) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_table(path: str | Path, table: str, name: str) -> Path:
    """Put ``table`` between the ``<!-- name:begin/end -->`` markers of a markdown file (else append it)."""
    path = Path(path)
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{table}{end}"
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = (text.rstrip("\n") + "\n\n" if text.strip() else "") + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, text)
