"""``scripts/prepare_data.py``: prepare a corpus into ``<data.root>/<data.name>/``."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from nanoattn.config import DataConfig
from nanoattn.data import prepare_data
from nanoattn.validation import check_bool, fail, from_dict


@dataclass
class PrepareDataConfig:
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    force: bool = False  # re-prepare even when the folder is up to date with this config

    def __post_init__(self) -> None:
        if isinstance(self.data, Mapping):
            self.data = from_dict(DataConfig, self.data, owner="data")
        if not isinstance(self.data, DataConfig):
            fail("prepare_data", "data", self.data, "must be a DataConfig or a mapping")
        check_bool("prepare_data", "force", self.force)


def prepare(cfg: PrepareDataConfig) -> Path:
    """Prepare ``cfg.data`` (the library prints its statistics); the prepared folder."""
    return prepare_data(cfg.data, force=cfg.force)
