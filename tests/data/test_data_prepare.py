"""prepare_data: the files it writes, when it does nothing, when it re-prepares, atomic writes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal

import numpy as np
import pytest

from nanoattn.config import TokenizerConfig
from nanoattn.data import DataError, TokenData, ensure_prepared, prepare_data
from nanoattn.data import prepare as prepare_module
from nanoattn.data.corpora import load_corpus


def _stamp(folder):
    return {f.name: f.stat().st_mtime_ns for f in folder.iterdir()}


def test_prepared_files_hold_every_document_then_eot(tmp_path, write_corpus, text_config):
    cfg = text_config(tmp_path / "data", write_corpus(tmp_path / "corpus", 6), tokenizer="bpe")
    folder = prepare_data(cfg)
    assert folder == tmp_path / "data" / "tiny"
    assert sorted(p.name for p in folder.iterdir()) == ["meta.json", "tokenizer.json", "train-000000.bin",
                                                       "train.progress.json", "val-000000.bin",
                                                       "val.progress.json"]
    assert [p.name for p in folder.parent.iterdir()] == ["tiny"]  # no temporary folder left behind
    data, corpus = TokenData(folder), load_corpus(cfg)
    for split, docs in (("train", corpus.train), ("val", corpus.val)):
        ids = data.tokens(split)[:]
        assert ids.dtype == np.uint16 and ids.size == data.meta["tokens"][split]
        ends = np.flatnonzero(ids == data.eot_id)
        assert ends.size == len(docs) and ends[-1] == ids.size - 1
        texts = [data.tokenizer.decode(part.tolist()) for part in np.split(ids, ends[:-1] + 1)]
        assert texts == [d.text for d in docs]
    meta = data.meta
    assert meta["corpus"]["documents"] == {"train": 5, "val": 1}
    assert meta["corpus"]["val_documents"] == [d.name for d in corpus.val]
    assert meta["tokenizer"] == {"type": "bpe", "vocab_size": 300, "eot_id": data.eot_id}
    val_bytes = sum(len(d.text.encode()) for d in corpus.val)
    assert meta["corpus"]["bytes"]["val"] == val_bytes
    assert data.bytes_per_token == val_bytes / data.tokens("val").size
    assert data.vocab_size == data.tokenizer.get_vocab_size() == 300


def test_rerun_is_a_no_op_and_changes_re_prepare(tmp_path, write_corpus, text_config, capsys):
    files = write_corpus(tmp_path / "corpus", 4)
    cfg = text_config(tmp_path / "data", files)
    folder = prepare_data(cfg)
    first = _stamp(folder)
    capsys.readouterr()
    assert prepare_data(cfg) == folder and _stamp(folder) == first
    assert "up to date" in capsys.readouterr().out
    assert ensure_prepared(cfg) == folder and capsys.readouterr().out == ""  # quiet when nothing to do
    fingerprints = {json.loads((folder / "meta.json").read_text())["fingerprint"]}
    for changed in (dataclasses.replace(cfg, tokenizer=TokenizerConfig(type="char")),
                    dataclasses.replace(cfg, seed=3)):
        prepare_data(changed)
        fingerprints.add(json.loads((folder / "meta.json").read_text())["fingerprint"])
    files[0].write_text(files[0].read_text() + "More text.\n")
    ensure_prepared(cfg)
    fingerprints.add(json.loads((folder / "meta.json").read_text())["fingerprint"])
    assert len(fingerprints) == 4
    assert "prepared" in capsys.readouterr().out
    before = _stamp(folder)
    prepare_data(cfg, force=True)
    assert _stamp(folder) != before
    moved = dataclasses.replace(cfg, root=str(tmp_path / "elsewhere"))
    assert prepare_module.fingerprint(moved) == prepare_module.fingerprint(cfg)  # root only says where


def test_an_interrupted_prepare_keeps_the_previous_folder(tmp_path, write_corpus, text_config, monkeypatch):
    cfg = text_config(tmp_path / "data", write_corpus(tmp_path / "corpus", 4))
    folder = prepare_data(cfg)
    before = (folder / "meta.json").read_text()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_module, "_meta", interrupted)  # dies after the .bin files are written
    with pytest.raises(KeyboardInterrupt):
        prepare_data(cfg, force=True)
    assert (folder / "meta.json").read_text() == before
    assert sorted(p.name for p in folder.parent.iterdir()) == [prepare_module.partial_dir(cfg).name, "tiny"]
    prepare_data(cfg)  # resumes: every split is done, so it only writes meta.json and renames
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny"]


def test_literal_eot_text_inside_a_document_is_not_a_separator(tmp_path, write_corpus, text_config):
    files = write_corpus(tmp_path / "corpus", 3)
    files[1].write_text("before <|endoftext|> after\n")
    data = TokenData(prepare_data(text_config(tmp_path / "data", files, val_fraction=0.4)))
    ids = np.concatenate([data.tokens("train")[:], data.tokens("val")[:]])
    assert (ids == data.eot_id).sum() == 3


def test_re_preparing_never_deletes_what_it_did_not_write(tmp_path, write_corpus, text_config):
    cfg = text_config(tmp_path / "data", write_corpus(tmp_path / "corpus", 4))
    folder = prepare_data(cfg)
    (folder / "run1").mkdir()
    (folder / "run1" / "config.yaml").write_text("a run placed inside the data folder\n")
    with pytest.raises(DataError, match=r"tiny holds run1, which preparation did not write"):
        prepare_data(cfg, force=True)
    assert (folder / "run1" / "config.yaml").exists() and (folder / "train-000000.bin").exists()


def test_sigterm_while_preparing_keeps_the_old_folder_and_the_next_run_resumes(tmp_path, write_corpus,
                                                                              text_config, monkeypatch):
    cfg = text_config(tmp_path / "data", write_corpus(tmp_path / "corpus", 4))
    folder = prepare_data(cfg)
    before = _stamp(folder)
    changed = dataclasses.replace(cfg, shard_tokens=1000)
    original = prepare_module.write_split

    def terminated(folder, split, *args, **kwargs):
        if split == "val":
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, the train shards written
        return original(folder, split, *args, **kwargs)

    monkeypatch.setattr(prepare_module, "write_split", terminated)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM while preparing data"):
        prepare_data(changed)
    assert _stamp(folder) == before
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # restored
    partial = prepare_module.partial_dir(changed)
    written = {f.name: f.stat().st_mtime_ns for f in partial.glob("train-*.bin")}
    assert len(written) == 7  # 6,964 train tokens in shards of 1,000
    monkeypatch.setattr(prepare_module, "write_split", original)
    prepare_data(changed)
    assert {f.name: f.stat().st_mtime_ns for f in folder.glob("train-*.bin")} == written  # kept, not redone
    assert sorted(p.name for p in folder.parent.iterdir()) == ["tiny"]


def test_a_killed_preparations_leftovers_are_removed_by_the_next(tmp_path, write_corpus, text_config):
    cfg = text_config(tmp_path / "data", write_corpus(tmp_path / "corpus", 4))
    for leftover in (".tiny.partial-0123456789abcdef", ".tiny.old-0123456789abcdef"):
        (tmp_path / "data" / leftover).mkdir(parents=True)
        (tmp_path / "data" / leftover / "train-000000.bin").write_bytes(b"\0" * 8)
    (tmp_path / "data" / ".other.partial-keep").mkdir()  # another corpus' folder is not ours to remove
    prepare_data(cfg)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".other.partial-keep", "tiny"]
