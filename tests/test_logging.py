"""Loggers: jsonl lines survive a torn write, wandb failures never stop training, offline detection."""

import json
import sys
import types

import pytest

from nanoattn import logging as nl
from nanoattn.config import LoggerConfig


def test_jsonl_appends_one_object_per_line_and_truncation_drops_later_and_torn_lines(tmp_path):
    path = tmp_path / "metrics.jsonl"
    logger = nl.JsonlLogger(path)
    for step in (1, 2, 3):
        logger.log({"step": step, "train_loss": 1.0 / step})
    logger.close()
    with open(path, "a") as f:
        f.write('{"step": 4, "train_lo')  # a kill in the middle of a write
    assert [r["step"] for r in nl.read_metrics(path)] == [1, 2, 3]
    nl.truncate_metrics(path, 2)
    assert path.read_text().splitlines() == [json.dumps({"step": 1, "train_loss": 1.0}),
                                             json.dumps({"step": 2, "train_loss": 0.5})]


@pytest.mark.parametrize("lines,where,what", [
    (['{"step": 1}', "garbage", '{"step": 3}'], 2, "is not JSON"),
    (['{"step": 1}', "[1, 2]", '{"step": 3}'], 2, "is not a metrics record"),
    (['{"step": "one"}', '{"step": 2}'], 1, "is not a metrics record"),
])
def test_a_corrupt_record_before_the_last_line_is_refused_not_dropped(tmp_path, lines, where, what):
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"^{path}:{where} {what}"):
        nl.truncate_metrics(path, 1)
    assert path.read_text() == "\n".join(lines) + "\n"  # left as it was, for the user to look at


def _fake_wandb(monkeypatch, *, init=None, log=None):
    calls = {"init": [], "log": []}

    class Run:
        dir = "/tmp/fake-wandb/files"

        def define_metric(self, *args, **kwargs):
            pass

        def log(self, record):
            calls["log"].append(record)
            if log is not None:
                raise log

        def finish(self):
            pass

    def fake_init(**kwargs):
        calls["init"].append(kwargs)
        if init is not None:
            raise init
        return Run()

    module = types.SimpleNamespace(init=fake_init, Settings=lambda **kw: kw)
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_a_wandb_error_is_reported_once_and_training_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    calls = _fake_wandb(monkeypatch, log=RuntimeError("connection reset\nsecond line"))
    logger = nl.WandbLogger(LoggerConfig(type="wandb"), tmp_path, {"lr": 1})
    for step in range(3):
        logger.log({"step": step, "train_loss": 1.0})
    logger.close()
    err = capsys.readouterr().err
    assert len(calls["log"]) == 1  # switched off after the first failure
    assert err.count("wandb: disabled after an error (RuntimeError: connection reset)") == 1
    assert calls["init"][0]["mode"] == "offline" and calls["init"][0]["dir"] == str(tmp_path)


def test_a_failing_wandb_init_leaves_a_silent_logger(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    _fake_wandb(monkeypatch, init=OSError("no space"))
    logger = nl.WandbLogger(LoggerConfig(type="wandb"), tmp_path, {})
    logger.log({"step": 1})
    logger.close()
    assert capsys.readouterr().err.count("wandb: disabled") == 1


def test_wandb_mode_is_offline_without_a_login_and_never_probes_the_network(tmp_path, monkeypatch):
    for key in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc

    def no_network(*args, **kwargs):
        raise AssertionError("the network was probed")

    monkeypatch.setattr(nl.socket, "create_connection", no_network)
    assert nl.wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert nl.wandb_mode() == "disabled"


def test_a_logged_in_user_without_network_goes_offline(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)

    def unreachable(*args, **kwargs):
        raise OSError("network is unreachable")

    monkeypatch.setattr(nl.socket, "create_connection", unreachable)
    assert nl.wandb_mode() == "offline"


def test_the_console_without_a_terminal_prints_one_line_per_record_with_its_eta(capsys, monkeypatch):
    clock = iter([100.0, 110.0, 120.0])  # the start, then 10 s a record: 5 steps in 10 s, 5 more to go
    monkeypatch.setattr(nl.time, "perf_counter", lambda: next(clock))
    console = nl.ConsoleLogger(total_steps=10)
    console.log({"step": 5, "train_loss": 2.5, "lr": 1e-3, "tokens": 10, "tok_per_s": 1234.0})
    console.log({"step": 10, "train_loss": 2.0, "lr": 1e-4, "tokens": 20, "tok_per_s": 1000.0,
                 "val_loss": 2.1, "val_bpb": 1.2})
    console.close()
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["step 5/10 (50%, ETA 10s): train_loss 2.5000, lr 1.00e-03, 1,234 tok/s",
                     "step 10/10 (100%, ETA 0s): train_loss 2.0000, lr 1.00e-04, 1,000 tok/s; "
                     "val_loss 2.1000, val_bpb 1.2000"]
    assert nl.duration_text(3725) == "1h02m" and nl.duration_text(185) == "3m05s"


def test_training_seconds_sum_each_log_windows_tokens_over_its_rate_and_skip_evaluations():
    records = [{"step": 10, "tokens": 100, "tok_per_s": 50.0}, {"step": 10, "val_loss": 2.0},
               {"step": 20, "tokens": 300, "tok_per_s": 100.0}]
    assert nl.training_seconds(records) == [2.0, 2.0, 4.0]


def test_a_long_loop_off_a_terminal_says_how_far_it_is_and_when_it_ends(capsys, monkeypatch):
    clock = iter([0.0, 30.0, 60.0, 90.0])  # the start, then 30 s an item
    monkeypatch.setattr(nl.time, "perf_counter", lambda: next(clock))
    assert list(nl.with_progress([128, 256, 512], "length_eval (chunks)")) == [128, 256, 512]
    assert capsys.readouterr().err.splitlines() == [
        "length_eval (chunks): 1/3 done in 30s, ETA 1m00s",
        "length_eval (chunks): 2/3 done in 1m00s, ETA 30s",
        "length_eval (chunks): 3/3 done in 1m30s, ETA 0s"]
