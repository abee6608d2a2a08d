"""Runs that cannot corrupt each other: the run-directory lock, the run's own tokenizer, and the
one-line errors of an unusable out_dir or a failing disk (docs/reliability.md)."""

import copy
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import nanoattn.checkpoint as checkpoint_module
import nanoattn.train.step as step_module
from nanoattn.config import DataConfig
from nanoattn.data import prepare_data
from nanoattn.logging import read_metrics
from nanoattn.runtime import LockedError, exclusive_lock
from nanoattn.train import train

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "train.py")
REPO = Path(__file__).resolve().parents[2]


def test_a_second_process_on_a_running_run_is_refused_and_the_first_keeps_its_records(
        tmp_path, tiny_config, as_overrides):
    run_dir = tmp_path / "run"
    cfg = tiny_config(run_dir, max_steps=100_000, schedule="constant", ckpt_interval=20, keep_last=2)
    first = subprocess.Popen([sys.executable, SCRIPT, *as_overrides(cfg)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    refusal = (f"run directory {run_dir} is in use by process {first.pid}; "
               "wait for it to finish or stop it first")
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (run_dir / "checkpoints" / "latest").exists():
            time.sleep(0.05)
        # A resume from the command line and a fresh start in this process, at the same time: both refused.
        resume = subprocess.Popen([sys.executable, SCRIPT, *as_overrides(cfg), "train.resume=true"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        with pytest.raises(LockedError) as fresh_start:
            train(cfg)
        resume_stderr = resume.communicate(timeout=120)[1]
    finally:
        first.send_signal(signal.SIGTERM)  # checkpoints and exits
        first.wait(timeout=120)
    assert str(fresh_start.value) == refusal
    assert resume.returncode == 1 and resume_stderr.strip() == f"error: {refusal}"
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, len(records) + 1))  # nothing cut back
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert int(latest) == records[-1]["step"] and (run_dir / "checkpoints" / latest).is_dir()


def test_train_refuses_a_locked_run_directory_before_reading_it(tmp_path, tiny_config):
    run_dir = tmp_path / "run"
    with exclusive_lock(run_dir, f"run directory {run_dir}"):
        with pytest.raises(LockedError, match=rf"in use by process {os.getpid()}"):
            train(tiny_config(run_dir))
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]
    assert list(run_dir.iterdir()) == []  # the lock leaves nothing behind
    train(tiny_config(run_dir, max_steps=2))  # and is free again


def _other_tokenizer_data(data: dict) -> DataConfig:
    """The same data.name re-prepared with a different tokenizer (a char one over the same text)."""
    return DataConfig.from_dict({**copy.deepcopy(data), "tokenizer": {"type": "char"}})


def test_checkpoints_keep_the_runs_tokenizer_when_the_data_folder_is_re_prepared(tmp_path, tiny_data,
                                                                                  tiny_config, monkeypatch):
    data = {**copy.deepcopy(tiny_data), "root": str(tmp_path / "data")}
    cfg = tiny_config(tmp_path / "run", max_steps=8, ckpt_interval=2, keep_last=None)
    cfg["data"] = data
    saves = {"n": 0}
    original_save = checkpoint_module.save_checkpoint

    def save_then_re_prepare(*args, **kwargs):
        path = original_save(*args, **kwargs)
        saves["n"] += 1
        if saves["n"] == 1:  # another run re-prepares the same data.name with another tokenizer
            prepare_data(_other_tokenizer_data(data), force=True)
        return path

    monkeypatch.setattr("nanoattn.train.loop.save_checkpoint", save_then_re_prepare)
    run_dir = train(cfg)
    started_with = (run_dir / "tokenizer.json").read_text()
    ckpts = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.is_dir())
    assert len(ckpts) == 4
    assert all((p / "tokenizer.json").read_text() == started_with for p in ckpts)
    assert (tmp_path / "data" / "tiny" / "tokenizer.json").read_text() != started_with  # it did change


def test_resume_after_the_corpus_changed_is_refused_naming_both_tokenizers(tmp_path, tiny_data, tiny_config):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(open(tiny_data["paths"][0]).read())
    data = {**copy.deepcopy(tiny_data), "root": str(tmp_path / "data"), "paths": [str(corpus)],
            "tokenizer": {"type": "char"}}
    cfg = tiny_config(tmp_path / "run", max_steps=4, model={"vocab_size": 128})
    cfg["data"] = data
    run_dir = train(cfg)
    # New characters where the training split reads them: the char tokenizer is rebuilt with them.
    corpus.write_text("Zwölf Qualen: new characters.\n" + corpus.read_text())
    resume = {**cfg, "train": {**cfg["train"], "resume": True, "max_steps": 6}}
    folder, snapshot = tmp_path / "data" / "tiny", run_dir / "tokenizer.json"
    with pytest.raises(ValueError, match=rf"^data folder {folder} holds another tokenizer than {snapshot}: "):
        train(resume)
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["step"] == 4  # the run is untouched


def test_an_out_dir_that_is_a_file_or_read_only_is_one_line(tmp_path, tiny_config):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(ValueError, match=r"^out_dir '.*file' is a file; a run needs a directory$"):
        train(tiny_config(tmp_path / "file"))
    # /sys refuses new entries even to root, where a chmod-ed folder would not.
    with pytest.raises(OSError, match=r"^\[Errno 1\] Operation not permitted: '/sys/nanoattn-run'$"):
        train(tiny_config("/sys/nanoattn-run"))


def test_a_full_disk_while_checkpointing_keeps_the_previous_checkpoint_and_says_so(tmp_path, tiny_config,
                                                                                 monkeypatch):
    original = checkpoint_module.save_file
    calls = {"n": 0}

    def full_disk(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return original(*args, **kwargs)

    monkeypatch.setattr(checkpoint_module, "save_file", full_disk)
    run_dir = tmp_path / "run"
    with pytest.raises(OSError) as err:
        train(tiny_config(run_dir, max_steps=8, ckpt_interval=4))
    failed = run_dir / "checkpoints" / "000008"
    assert str(err.value) == (f"could not save checkpoint {failed} (No space left on device); "
                              "the previous checkpoint is intact")
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["000004", "latest"]  # no partial copy left
    assert (ckpts / "latest").read_text() == "000004\n"


def _fail_at_update(monkeypatch, update: int) -> None:
    """Make training update ``update`` (1-based) fail as a GPU running out of memory does."""
    original, calls = step_module.LossModule.forward, {"n": 0}

    def forward(self, x, y):
        calls["n"] += 1
        if calls["n"] >= update:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, x, y)

    monkeypatch.setattr(step_module.LossModule, "forward", forward)


def test_a_start_that_fails_before_training_leaves_nothing_and_the_same_out_dir_starts_again(
        tmp_path, tiny_config, monkeypatch):
    run_dir = tmp_path / "run"
    _fail_at_update(monkeypatch, 1)  # the first step: out of memory
    with pytest.raises(torch.OutOfMemoryError):
        train(tiny_config(run_dir, batch_size=64))
    assert list(run_dir.iterdir()) == []  # no config.yaml to block a retry, nothing else left
    monkeypatch.undo()
    train(tiny_config(run_dir, model={"d_model": 16}, max_steps=2))  # retried, with another model
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["model"]["d_model"] == 16
    # A run that failed after it trained keeps every file: its records say how far it went.
    kept = tmp_path / "kept"
    _fail_at_update(monkeypatch, 3)
    with pytest.raises(torch.OutOfMemoryError):
        train(tiny_config(kept))
    assert [r["step"] for r in read_metrics(kept / "metrics.jsonl")] == [1, 2]
    assert {"config.yaml", "tokenizer.json", "data.json"} <= {p.name for p in kept.iterdir()}


def test_a_new_run_never_overwrites_files_it_did_not_write(tmp_path, tiny_config):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("someone's records\n")
    with pytest.raises(ValueError, match=rf"^out_dir '{folder}' holds metrics.jsonl but no run \(no "
                                         r"config.yaml\): a run never overwrites files it did not write"):
        train(tiny_config(folder))
    assert sorted(p.name for p in folder.iterdir()) == ["metrics.jsonl"]
    assert (folder / "metrics.jsonl").read_text() == "someone's records\n"


def test_an_out_dir_that_is_the_repository_empty_or_inside_a_checkpoint_is_refused(tmp_path, tiny_config):
    before = sorted(p.name for p in REPO.iterdir())
    with pytest.raises(ValueError, match=rf"^out_dir='{REPO}' is invalid: it is the root of the repository"):
        train(tiny_config(REPO))
    assert sorted(p.name for p in REPO.iterdir()) == before
    with pytest.raises(ValueError, match=r"^run.out_dir='' is invalid: must be a non-empty string"):
        train(tiny_config(""))
    run_dir = train(tiny_config(tmp_path / "run", max_steps=4))
    for holder in (run_dir / "checkpoints" / "000004", run_dir / "checkpoints"):  # pruning deletes both
        inside = holder / "again"
        with pytest.raises(ValueError, match=rf"^out_dir='{inside}' is invalid: it is inside {holder}, which "
                                             r"holds checkpoints or a model's files, never other outputs "
                                             r"\(pruning deletes checkpoints\); write beside it$"):
            train(tiny_config(inside))
        assert not inside.exists()
