"""Every encoding and attention variant against its paper and a reference implementation.

``rows.ROWS`` holds one row per ``pos=`` option (``encoding_options()``) and per attention variant
(``ATTENTION_VARIANTS``): the paper, and the checks. A check names its reference (a packaged
implementation, or the paper's equations written out here in float64 where no package has them),
measures the largest difference between nanoattn's output and the reference's on small seeded
inputs (a bias, rotated queries and keys, an attention layer's output, or a model's logits), and
states its tolerance, with its reason beside it (the suite asserts every check within it).
``scripts/reference_table.py`` runs every check and publishes ``docs/results/references.md``
(``table.publish``).

The difference is max |ours - reference| / max(1, |reference|) over the compared entries:
absolute for entries below 1 and relative above, so one float32 tolerance reads the same for a
rotated query of size 1 and a power-kernel bias of size 10^6. float32 rounds every operation
at 2^-24 (6e-8) relative: both sides in float32 with the same operations agree exactly, a few
operations in another order differ by ~1e-7, and a model's logits, after several layers of
64-wide sums and softmaxes, by a few 1e-6.

Where nanoattn and a reference differ by a convention (a layout of the dims, an initialisation,
where a scale is applied), the check converts one into the other and the row's note says how.
Entries of a bias where a key comes after its query are masked by the attention, so only the
visible ones are compared.

The references are the dev extras (``pip install -e '.[dev]'``): transformers, x-transformers and
rotary-embedding-torch. Nothing else in nanoattn imports this package, so nanoattn runs without them.
"""
