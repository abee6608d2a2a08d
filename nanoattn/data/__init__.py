"""The data layer: corpora, tokenizers, prepared token files and the batch loader.

``prepare_data`` / ``ensure_prepared`` / ``open_prepared`` turn a ``DataConfig`` into
``<root>/<name>/``; ``TokenData`` reads such a folder back. Each module's docstring states its design choices.
"""

from nanoattn.data.errors import DataError
from nanoattn.data.loader import TokenData, bits_per_byte
from nanoattn.data.prepare import data_dir, ensure_prepared, open_prepared, prepare_data
from nanoattn.data.random_positions import RandomPositions
from nanoattn.data.tasks import TaskData
from nanoattn.data.tokenizer import EOT, digit_ids, load_tokenizer

__all__ = ["DataError", "EOT", "RandomPositions", "TaskData", "TokenData", "bits_per_byte", "data_dir",
           "digit_ids", "ensure_prepared", "load_tokenizer", "open_prepared", "prepare_data"]
