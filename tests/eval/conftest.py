"""The evaluation commands' schemas, registered as their scripts register them, for compose tests."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from _hydra_cli import register_schema  # noqa: E402  (scripts/ is not a package)

from nanoattn.commands.analyze_heads import HeadAnalysisConfig  # noqa: E402
from nanoattn.commands.compare_length import CompareLengthConfig  # noqa: E402
from nanoattn.commands.eval_length import LengthEvalConfig  # noqa: E402
from nanoattn.commands.eval_passkey import PasskeyEvalConfig  # noqa: E402
from nanoattn.commands.eval_task import TaskEvalConfig  # noqa: E402
from nanoattn.commands.labs import AttentionLabConfig, LabConfig, TaskLabConfig  # noqa: E402
from nanoattn.config import DataConfig  # noqa: E402
from nanoattn.data import ensure_prepared  # noqa: E402

SCHEMAS = {"eval_length": LengthEvalConfig, "eval_passkey": PasskeyEvalConfig,
           "analyze_heads": HeadAnalysisConfig, "compare_length": CompareLengthConfig,
           "extrapolation_lab": LabConfig, "attention_lab": AttentionLabConfig, "eval_task": TaskEvalConfig,
           "task_lab": TaskLabConfig}


@pytest.fixture(scope="session")
def eval_schemas() -> dict[str, type]:
    """{command: its config dataclass}, each stored in Hydra's ConfigStore as ``<command>_schema``."""
    for name, cls in SCHEMAS.items():
        register_schema(f"{name}_schema", cls)
    return SCHEMAS


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """A byte-tokenized corpus of 12 documents (one held out), prepared by the data layer."""
    root = tmp_path_factory.mktemp("length_data")
    docs = root / "docs"
    docs.mkdir()
    generator = torch.Generator().manual_seed(6)
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    for i in range(12):
        picks = torch.randint(0, len(words), (400,), generator=generator).tolist()
        (docs / f"doc{i:02d}.txt").write_text(" ".join(words[p] for p in picks) + "\n")
    cfg = DataConfig(name="tiny", corpus="text", paths=[str(docs)], root=str(root / "data"),
                     tokenizer={"type": "byte"}, val_fraction=0.1)
    return ensure_prepared(cfg)
