"""Publish the reference table: ``python scripts/reference_table.py``.

Runs every check of ``nanoattn.references`` (each encoding and attention variant against its paper
and a reference implementation) and writes ``docs/results/references.json`` and the page rendered
from it, ``references.md``. The references are the dev extras (``pip install -e '.[dev]'``):
transformers, x-transformers and rotary-embedding-torch.
"""

import sys

REFERENCES = ("transformers", "x_transformers", "rotary_embedding_torch")

if __name__ == "__main__":
    try:
        from nanoattn.references.table import publish
    except ImportError as e:
        if e.name not in REFERENCES:
            raise
        sys.exit(f"error: the reference table needs {e.name} (a dev extra): pip install -e '.[dev]'")
    print(f"wrote {publish()} and its JSON")
