"""Shared fixtures of the data tests: tiny seeded corpora written into tmp folders.

Helpers are handed out as fixtures (not imported) because tests/ has no packages.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from nanoattn.config import DataConfig, TokenizerConfig
from nanoattn.data import TokenData, prepare_data

WORDS = ("the", "king", "queen", "lord", "sweet", "night", "love", "death", "crown", "sword", "hath",
         "thou", "art", "fair", "speak", "hence", "ay", "no", "what", "my", "heart", "is", "not", "so")


def _fake_text(n_chars: int, seed: int) -> str:
    """Seeded lines of words: varied enough for BPE to learn merges, always the same alphabet."""
    rng = random.Random(seed)
    lines, size = [], 0
    while size < n_chars:
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10)))
        line = words.capitalize() + rng.choice(".,;!?")
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


def _write_corpus(folder: Path, n_docs: int, n_chars: int = 2000) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    files = [folder / f"doc{i:02d}.txt" for i in range(n_docs)]
    for i, f in enumerate(files):
        f.write_text(_fake_text(n_chars, seed=i))
    return files


def _text_config(root: Path, paths: list[Path], tokenizer: str = "byte", **overrides) -> DataConfig:
    return DataConfig(name="tiny", corpus="text", paths=[str(p) for p in paths], root=str(root),
                      tokenizer=TokenizerConfig(type=tokenizer, vocab_size=300), **overrides)


@pytest.fixture
def fake_text() -> Callable[[int, int], str]:
    return _fake_text


@pytest.fixture
def write_corpus() -> Callable[..., list[Path]]:
    """write_corpus(folder, n_docs, n_chars=2000) -> the files, doc00.txt ... (seeded by index)."""
    return _write_corpus


@pytest.fixture
def text_config() -> Callable[..., DataConfig]:
    """text_config(root, paths, tokenizer="byte", **fields): a `text` DataConfig named "tiny"."""
    return _text_config


@pytest.fixture(scope="session")
def byte_data(tmp_path_factory: pytest.TempPathFactory) -> TokenData:
    """A prepared 20-document corpus with the byte tokenizer (about 36k train, 4k val tokens)."""
    tmp = tmp_path_factory.mktemp("byte_data")
    return TokenData(prepare_data(_text_config(tmp / "data", _write_corpus(tmp / "corpus", 20))))
