"""Streamed, sharded, resumable preparation: rows corpora, shards against a direct encoding, the
tokenizer's sample, a saved tokenizer, a SIGKILL mid-shard resumed byte for byte."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tokenizers import Tokenizer, models

from nanoattn.bench.prepare import kill_mid_shard, rows_config, same_shards, write_rows_corpus
from nanoattn.config import DataConfig, TokenizerConfig
from nanoattn.data import DataError, TokenData, prepare_data
from nanoattn.data.corpora import held_out
from nanoattn.data.tokenizer import build_tokenizer, sample_texts

SHARD = 20_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """About 2 MB of JSON lines, an empty row among them."""
    path = tmp_path_factory.mktemp("rows") / "corpus.jsonl"
    write_rows_corpus(path, 2_000_000)
    with open(path, "a") as out:
        out.write(json.dumps({"text": "  "}) + "\n")
    return path


@pytest.fixture(scope="module")
def prepared(corpus, tmp_path_factory) -> tuple[DataConfig, Path]:
    cfg = rows_config(corpus, tmp_path_factory.mktemp("data"), "rows", SHARD)
    return cfg, prepare_data(cfg)


def _texts(path: Path) -> list[str]:
    return [json.loads(line)["text"] for line in path.read_text().splitlines()]


def test_shards_hold_the_rows_of_each_split_in_order_each_then_eot(corpus, prepared):
    cfg, folder = prepared
    data = TokenData(folder)
    texts = _texts(corpus)
    tokenizer = data.tokenizer
    for split in ("train", "val"):
        kept = [t for row, t in enumerate(texts)
                if held_out(row, cfg.seed, cfg.val_fraction) == (split == "val") and t.strip()]
        expected = np.concatenate([[*tokenizer.encode(t).ids, data.eot_id] for t in kept])
        shards = data.meta["shards"][split]
        assert all(size == SHARD for size in shards[:-1]) and 0 < shards[-1] <= SHARD
        assert np.array_equal(data.tokens(split)[:], expected)
        assert data.meta["corpus"]["documents"][split] == len(kept)
        assert data.meta["corpus"]["bytes"][split] == sum(len(t.encode()) for t in kept)
    assert len(data.meta["shards"]["train"]) > 10 and data.meta["corpus"]["documents"]["val"] > 0
    assert data.bytes_per_token == data.meta["corpus"]["bytes"]["val"] / data.tokens("val").size


def test_a_sharded_split_reads_as_one_sequence(prepared):
    data = TokenData(prepared[1])
    tokens = data.tokens("train")
    joined = np.concatenate([np.fromfile(prepared[1] / f"train-{i:06d}.bin", dtype=np.uint16)
                             for i in range(len(data.meta["shards"]["train"]))])
    for start, stop in ((0, 10), (SHARD - 5, SHARD + 5), (SHARD - 1, 3 * SHARD + 2), (tokens.size - 3, None)):
        assert np.array_equal(tokens[start:stop], joined[start:stop])
    x, y = data.train_batch(3, batch_size=8, seq_len=2 * SHARD, seed=1)  # windows across two boundaries
    windows = joined.tobytes()
    for row_x, row_y in zip(x.tolist(), y.tolist(), strict=True):
        assert np.array([*row_x, row_y[-1]], dtype=np.uint16).tobytes() in windows
    with pytest.raises(TypeError, match="read in slices, not by int"):
        tokens[0]


def test_the_tokenizer_learns_from_the_first_sample_chars(corpus, prepared):
    cfg, folder = prepared
    train = [t for row, t in enumerate(_texts(corpus)) if not held_out(row, cfg.seed, cfg.val_fraction)]
    expected = build_tokenizer(cfg.tokenizer, sample_texts(train, cfg.tokenizer.sample_chars))
    assert TokenData(folder).tokenizer.to_str() == expected.to_str()
    assert list(sample_texts(["abc", "defg", "hi"], 5)) == ["abc", "de"]


def test_parquet_rows_prepare_the_same_shards(corpus, prepared, tmp_path):
    cfg, folder = prepared
    table = tmp_path / "corpus.parquet"
    pq.write_table(pa.table({"text": _texts(corpus)}), table, row_group_size=100)
    parquet = prepare_data(dataclasses.replace(cfg, paths=[str(table)], root=str(tmp_path / "data")))
    assert same_shards(parquet, folder)


def test_a_preparation_sigkilled_mid_shard_resumes_to_the_same_bytes(corpus, prepared, tmp_path):
    cfg, folder = prepared
    killed = dataclasses.replace(cfg, root=str(tmp_path / "killed"))
    finished = kill_mid_shard(killed, after_shards=2)
    assert finished < len(TokenData(folder).meta["shards"]["train"])  # killed before the end
    assert not (tmp_path / "killed" / cfg.name).exists()
    prepare_data(killed)
    assert same_shards(tmp_path / "killed" / cfg.name, folder)
    assert sorted(p.name for p in (tmp_path / "killed").iterdir()) == [cfg.name]


def test_a_saved_tokenizer_file_is_used_as_it_is(prepared, tmp_path):
    cfg, folder = prepared
    saved = tmp_path / "tokenizer.json"
    saved.write_bytes((folder / "tokenizer.json").read_bytes())
    reuse = dataclasses.replace(cfg, name="reuse", tokenizer=TokenizerConfig(type="file", path=str(saved)))
    data = TokenData(prepare_data(reuse))
    assert same_shards(data.data_dir, folder)
    assert data.tokenizer.to_str() == TokenData(folder).tokenizer.to_str()
    Tokenizer(models.WordLevel({"word": 0, "[UNK]": 1}, unk_token="[UNK]")).save(str(saved))
    with pytest.raises(DataError, match=rf"^data.tokenizer.path={saved}: the tokenizer has no <\|endoftext"):
        prepare_data(reuse)


def test_bad_rows_are_refused_in_one_line(tmp_path):
    mixed = [tmp_path / "a.jsonl", tmp_path / "b.txt"]
    for f in mixed:
        f.write_text(json.dumps({"text": "hello"}) + "\n")
    cfg = DataConfig(name="bad", corpus="rows", paths=[str(f) for f in mixed], root=str(tmp_path / "data"),
                     tokenizer=TokenizerConfig(type="byte"))
    with pytest.raises(DataError, match=r"b.txt is not one of the allowed kinds: every file .jsonl/.json"):
        prepare_data(cfg)
    mixed[1].unlink()
    mixed[0].write_text(json.dumps({"body": "hello"}) + "\n")
    with pytest.raises(DataError, match=r"^data.text_field='text' is not a column of rows; columns: body$"):
        prepare_data(dataclasses.replace(cfg, paths=[str(mixed[0])]))
    mixed[0].write_text(json.dumps({"text": "hello"}) + "\n" + json.dumps({"text": 3}) + "\n")
    with pytest.raises(DataError, match=r"^rows row 1: 'text' is int, not text$"):
        prepare_data(dataclasses.replace(cfg, paths=[str(mixed[0])]))
