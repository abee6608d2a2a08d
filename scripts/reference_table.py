"""Publish the reference table: ``python scripts/reference_table.py``.

Runs every check of ``tests/reference_checks.py`` (each encoding and attention variant against
its paper and a reference implementation) and writes ``docs/results/references.json`` and the
page rendered from it, ``references.md``. The references are the dev extras
(``pip install -e '.[dev]'``): transformers, x-transformers and rotary-embedding-torch.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/ is not a package
from reference_checks import publish  # noqa: E402

if __name__ == "__main__":
    print(f"wrote {publish()} and its JSON")
