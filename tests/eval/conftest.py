"""The evaluation commands' schemas, registered as their scripts register them, for compose tests."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from _hydra_cli import register_schema  # noqa: E402  (scripts/ is not a package)

from nanoattn.commands.analyze_heads import HeadAnalysisConfig  # noqa: E402
from nanoattn.commands.compare_length import CompareLengthConfig  # noqa: E402
from nanoattn.commands.eval_length import LengthEvalConfig  # noqa: E402
from nanoattn.commands.eval_passkey import PasskeyEvalConfig  # noqa: E402
from nanoattn.commands.eval_task import TaskEvalConfig  # noqa: E402
from nanoattn.commands.labs import AttentionLabConfig, LabConfig, TaskLabConfig  # noqa: E402

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
