"""scripts/train.py end to end: exact resume after SIGKILL, DDP, wandb offline, sweeps, bad input."""

from __future__ import annotations

import importlib
import os
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
import test_one_line_errors as one_line_errors
import torch
import yaml
from omegaconf import OmegaConf, open_dict

import nanoattn.train.step as step
from nanoattn import GPT
from nanoattn.config import RunConfig
from nanoattn.config.options import encoding_options
from nanoattn.logging import read_metrics
from nanoattn.train import train

SCRIPT_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "scripts")
def _latest_step(run_dir) -> int | None:
    latest = run_dir / "checkpoints" / "latest"
    return int(latest.read_text()) if latest.exists() else None


def test_sigkill_after_a_checkpoint_then_resume_equals_the_uninterrupted_run(tmp_path, tiny_config,
                                                                             as_overrides, run_script,
                                                                             compare_runs):
    # Constant schedule so that max_steps (which may change on resume) does not change the lr;
    # dropout and gradient accumulation so the RNG and the micro-steps must be restored too.
    options = dict(model={"dropout": 0.1}, grad_accum=2, schedule="constant", ckpt_interval=5,
                   eval_interval=5, log_interval=1)
    run_dir = tmp_path / "run"
    args = as_overrides(tiny_config(run_dir, **{**options, "max_steps": 100_000}))
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen([sys.executable, os.path.join(SCRIPT_DIR, "train.py"), *args],
                                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            step = _latest_step(run_dir)
            records = read_metrics(run_dir / "metrics.jsonl") if (run_dir / "metrics.jsonl").exists() else []
            if step is not None and records and records[-1]["step"] >= step + 2:
                break
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    killed_at = read_metrics(run_dir / "metrics.jsonl")[-1]["step"]
    n = _latest_step(run_dir)
    assert n is not None and killed_at > n, (tmp_path / "killed.log").read_text()

    end = n + 7
    resumed = run_script(*args, "train.resume=true", f"train.max_steps={end}")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {run_dir / 'checkpoints' / f'{n:06d}'} at step {n}" in resumed.stderr
    reference = train(tiny_config(tmp_path / "reference", **{**options, "max_steps": end}))
    compare_runs(run_dir, reference, 1e-6)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_node_ddp_matches_one_process_with_the_same_global_batch_and_resumes_on_one_node(
        tmp_path, tiny_config, as_overrides, compare_runs):
    # Rank r takes the r-th slice of one global draw of windows, so 2 ranks x 2 sequences see
    # the 4 sequences of one process: the same losses and grad norms prove that the ranks saw
    # different data and that DDP averaged their gradients. The runs are float32 (tiny_config), so
    # they differ only in the order the gradient's terms are summed: a few float32 ulps (1.2e-7
    # relative, 6e-7 at a loss of 5), which 1e-5 bounds over 6 updates. AdamW: torch.optim.Muon
    # orthogonalises in bf16 whatever train.dtype says, so a float32 ulp of the gradient can round to
    # another bf16 update, and no tolerance would tell DDP's trajectory from a lost momentum buffer;
    # the optimizer acts on the averaged gradient alone, the same code whatever the ranks.
    options = dict(batch_size=2, max_steps=6, eval_interval=2, ckpt_interval=2, log_interval=1,
                   schedule="constant", optimizer="adamw")
    args = [a for a in as_overrides(tiny_config(tmp_path, **options)) if not a.startswith("out_dir=")]
    script = os.path.join(SCRIPT_DIR, "train.py")
    torchrun = [sys.executable, "-m", "torch.distributed.run"]
    # Two nodes of one process each, as docs/training.md launches them: a c10d rendezvous at the
    # first node's address, here both on this machine.
    rendezvous = [f"--rdzv_endpoint=127.0.0.1:{free_port()}", "--rdzv_backend=c10d", "--rdzv_id=nodes",
                  "--nnodes=2", "--nproc_per_node=1"]
    nodes = [subprocess.Popen([*torchrun, *rendezvous, script, *args], cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    ends = [node.communicate(timeout=300) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), [err for _, err in ends]
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1, runs  # rank 0 chose the directory; rank 1's own ${now:} left nothing
    assert sum(err.count("done: step 6/6") for _, err in ends) == 1  # only rank 0 reports
    run_dir = runs[0]
    (tmp_path / "uninterrupted").mkdir()
    shutil.copy(run_dir / "metrics.jsonl", tmp_path / "uninterrupted" / "metrics.jsonl")

    # A kill after update 6's record, before its checkpoint was complete: the two ranks resume from
    # checkpoint 4, now as two processes of one node, and must repeat updates 5 and 6 exactly (the
    # same ranks, the same summation order).
    shutil.rmtree(run_dir / "checkpoints" / "000006")
    (run_dir / "checkpoints" / "latest").write_text("000004\n")
    resumed = subprocess.run([*torchrun, "--standalone", "--nproc_per_node=2", script, *args,
                              f"out_dir={run_dir}", "train.resume=true"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stderr.count(f"resumed from {run_dir / 'checkpoints' / '000004'} at step 4") == 1
    compare_runs(run_dir, tmp_path / "uninterrupted", 1e-6)

    reference = train(tiny_config(tmp_path / "reference", **{**options, "batch_size": 4}))
    compare_runs(run_dir, reference, 1e-5)


def test_wandb_without_login_runs_offline_under_the_run_dir(tmp_path, tiny_config, as_overrides, run_script):
    # HOME is a fresh folder (no ~/.netrc) and WANDB_API_KEY / WANDB_MODE are unset: not logged in,
    # so the logger picks offline mode itself, without touching the network.
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"))
    run_dir = tmp_path / "run"
    args = [a for a in as_overrides(tiny_config(run_dir, max_steps=4)) if not a.startswith("logger.")]
    result = subprocess.run([sys.executable, os.path.join(SCRIPT_DIR, "train.py"), *args, "logger=wandb"],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    offline = list((run_dir / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and list(offline[0].glob("run-*.wandb"))
    assert f"wandb sync {offline[0]}" in result.stderr
    assert len(read_metrics(run_dir / "metrics.jsonl")) == 4


def _main(monkeypatch, capsys, *args):
    """scripts/train.py in this process: (exit code or message, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", [os.path.join(SCRIPT_DIR, "train.py"), *args])
    monkeypatch.syspath_prepend(SCRIPT_DIR)
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    code = 0
    try:
        runpy.run_path(os.path.join(SCRIPT_DIR, "train.py"), run_name="__main__")
    except SystemExit as e:
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


BAD = [
    (["train.batch_sise=4"], "unknown key 'train.batch_sise'; allowed: batch_size, beta1"),
    (["train.batch_size=0"], "train.batch_size=0 is invalid: must be a positive integer"),
    (["train.lr=-1"], "train.lr=-1 is invalid: must be a positive number"),
    (["pos=foo"], "pos/foo"),
    (["model.n_kv_head=3"], "model.n_kv_head=3 is invalid: must divide n_head=4"),
    (["train.schedule=linear"], "train.schedule='linear' is invalid: allowed: cosine | wsd | constant"),
    (["train.optimizer=sgd"], "train.optimizer='sgd' is invalid: allowed: adamw | muon"),
    (["train.muon_lr_scale=0"], "train.muon_lr_scale=0 is invalid: must be a positive number"),
    (["train.muon_momentum=1"], "train.muon_momentum=1 is invalid: must be in [0, 1)"),
    (["train.schedule=wsd", "train.decay_steps=500"], "train.decay_steps=500 is invalid: is cosine's; with "
                                                      "schedule='wsd' it must be null"),
    (["train.decay_steps=10"], "train.decay_steps=10 is invalid: must be more than warmup_steps=50"),
    (["train.stop_at_accuracy=0.9"], "train.stop_at_accuracy=0.9 is invalid: needs a task (task.name)"),
    (["train.embedding_lr_scale=0"], "train.embedding_lr_scale=0 is invalid: must be a positive number"),
    # The default recipe sets the untied head's rate apart; tying the head back needs that rate at 1.
    (["model.tie_embeddings=true"], "train.head_lr_scale=0.3 is invalid: must be 1 with model.tie_"),
    (["attention=foo"], "attention/foo"),
    (["train.resume=true"], "holds no run"),
]


@pytest.mark.parametrize("args,message", BAD, ids=[a[0] for a, _ in BAD])
def test_bad_input_is_one_error_line(tmp_path, monkeypatch, capsys, args, message):
    code, out, err = _main(monkeypatch, capsys, f"out_dir={tmp_path / 'run'}", *args)
    assert isinstance(code, str) and code.startswith("error: ") and "\n" not in code, code
    assert message in code
    assert "Traceback" not in err + out
    assert not (tmp_path / "run").exists()  # Hydra's directory of a failed start is removed


def test_a_user_mistake_prints_no_traceback_in_a_real_process(tmp_path, run_script):
    for args in (["train.batch_sise=4"], ["train.batch_size=0"]):
        result = run_script(f"out_dir={tmp_path / 'run'}", *args)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr


def test_cfg_job_and_help_work(monkeypatch, capsys):
    code, out, _ = _main(monkeypatch, capsys, "--cfg", "job", "model=llama-tiny", "pos=alibi")
    cfg = yaml.safe_load(out)
    assert code in (0, None) and cfg["model"]["pos"] == "alibi" and cfg["model"]["n_kv_head"] == 2
    assert "batch_size" in cfg["train"] and "grad_accum" in cfg["train"]
    code, out, _ = _main(monkeypatch, capsys, "--help")
    assert code in (0, None) and f"pos: {', '.join(sorted(encoding_options()))}" in out  # every option


def test_a_multirun_sweep_lands_in_separate_run_directories(tmp_path, tiny_config, as_overrides,
                                                           monkeypatch, capsys):
    args = [a for a in as_overrides(tiny_config(tmp_path / "sweep", max_steps=2, eval_interval=0))
            if not a.startswith("model.pos")]
    code, _, err = _main(monkeypatch, capsys, "-m", *args, "pos=rope,alibi")
    assert code in (0, None), err
    for job, pos in (("pos=rope", "rope"), ("pos=alibi", "alibi")):  # named by the values swept
        saved = yaml.safe_load((tmp_path / "sweep" / job / "config.yaml").read_text())
        assert saved["model"]["pos"] == pos and saved["out_dir"] == str(tmp_path / "sweep" / job)
        assert (tmp_path / "sweep" / job / "checkpoints" / "latest").exists()


def test_a_sweep_runs_every_job_reports_the_failed_ones_at_its_end_and_fails(
        tmp_path, tiny_config, as_overrides, monkeypatch, capsys):
    args = [a for a in as_overrides(tiny_config(tmp_path / "sweep", max_steps=2, eval_interval=0))
            if not a.startswith("model.n_kv_head")]
    code, _, err = _main(monkeypatch, capsys, "-m", *args, "model.n_kv_head=1,3,2")  # 3 does not divide 2
    assert code == "error: 1 of 3 jobs of the sweep failed (listed above)"
    failed = ("job 1 (model.n_kv_head=3): model.n_kv_head=3 is invalid: must divide n_head=2 (MHA: "
              "n_kv_head=n_head, MQA: 1)")
    assert err.count(failed) == 2 and err.strip().splitlines()[-1] == f"  {failed}"  # when, and at the end
    for job in ("model.n_kv_head=1", "model.n_kv_head=2"):  # the jobs after the failed one ran too
        assert (tmp_path / "sweep" / job / "checkpoints" / "latest").exists()
    assert not (tmp_path / "sweep" / "model.n_kv_head=3").exists()


def test_a_sweep_whose_job_would_not_compose_is_refused_before_any_job_runs(tmp_path, tiny_config,
                                                                          as_overrides, monkeypatch, capsys):
    """Hydra composes each job just before it runs: an unknown option in the second job would end the
    sweep after the first had trained, and the later ones would never run."""
    args = [a for a in as_overrides(tiny_config(tmp_path / "sweep", max_steps=2, eval_interval=0))
            if not a.startswith("model.pos")]
    code, _, _ = _main(monkeypatch, capsys, "-m", *args, "pos=rope,bogus,alibi")
    assert code.startswith("error: job 1 (pos=bogus) of the sweep: In 'train': Could not find 'pos/bogus'")
    assert code.endswith("; no job was run") and "\n" not in code
    assert not (tmp_path / "sweep").exists()


def test_the_advice_after_a_stop_resumes_an_experiments_run_in_its_own_directory(
        tmp_path, tiny_config, as_overrides, monkeypatch, capsys):
    """experiment=extrapolation puts the run in <out_dir>/<pos>: the advice names that directory."""
    args = ["experiment=extrapolation", "pos=alibi",
            *as_overrides(tiny_config(tmp_path / "lab", max_steps=6, eval_interval=0, ckpt_interval=0))[1:]]
    original, calls = step.LossModule.forward, {"n": 0}

    def sigterm_at_the_third_update(self, x, y):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, x, y)

    monkeypatch.setattr(step.LossModule, "forward", sigterm_at_the_third_update)
    code, _, err = _main(monkeypatch, capsys, *args)
    run_dir = tmp_path / "lab" / "alibi"
    advice = f"stopped at step 3; continue it with its overrides and train.resume={run_dir}"
    assert code in (0, None) and advice in err.splitlines(), err
    monkeypatch.setattr(step.LossModule, "forward", original)
    code, _, err = _main(monkeypatch, capsys, *args, f"train.resume={run_dir}")
    assert code in (0, None), err
    assert (run_dir / "checkpoints" / "latest").read_text() == "000006\n"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [1, 2, 3, 4, 5, 6]
    assert sorted(p.name for p in (tmp_path / "lab").iterdir()) == ["alibi"]  # no lab/alibi/alibi


def test_init_from_refuses_a_model_key_the_checkpoint_holds_otherwise(tmp_path, tiny_config, as_overrides):
    """train.init_from trains the checkpoint's model: model.d_model=48 or pos=alibi over a RoPE
    checkpoint of width 32 was silently replaced by the checkpoint's; now refused in one line. The
    fields a fine-tune may change (the length, the scaling), and a key equal to the checkpoint's, pass."""
    sys.path.insert(0, SCRIPT_DIR)
    from _hydra_cli import CONFIG_PATH, check_init_from
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    importlib.import_module("train")  # registers the schema and the registries' groups
    source = train(tiny_config(tmp_path / "source", max_steps=1, ckpt_interval=0))
    base = [o for o in as_overrides(tiny_config(tmp_path / "tuned", init_from=str(source)))
            if not o.startswith("model.")]

    def check(*given: str) -> None:
        GlobalHydra.instance().clear()
        try:
            with initialize_config_dir(config_dir=CONFIG_PATH, version_base="1.3"):
                cfg = compose(config_name="train", overrides=[*base, *given], return_hydra_config=True)
                hydra_cfg = cfg.hydra
                with open_dict(cfg):
                    del cfg["hydra"]
                check_init_from(hydra_cfg, OmegaConf.to_container(cfg, resolve=True))
        finally:
            GlobalHydra.instance().clear()

    for given, key, value in ((["model.d_model=48"], "d_model", 48), (["pos=alibi"], "pos", "'alibi'")):
        with pytest.raises(ValueError, match=rf"^model\.{key}={value} is invalid with train\.init_from=\S+: "
                                             r"the checkpoint's is \S+, and its weights fix the model \(only "
                                             "max_seq_len, rope_scaling"):
            check(*given)
    check("model.d_model=32", "pos=rope", "model.max_seq_len=64")


@pytest.mark.parametrize("model", ["gpt2-small", "llama-124m"])
def test_the_gpu_recipe_trains_each_124m_preset_a_few_steps(model, tmp_path, tiny_config, as_overrides,
                                                             monkeypatch, capsys):
    """recipe=gpu as written on the preset's width, heads and blocks, shortened to one layer, the suite's
    byte vocabulary and two steps of two one-sequence micro-steps at 32 tokens (Muon orthogonalising
    all 12 layers' matrices takes about 10 s a step on two CPU cores); the run states its size."""
    data = [o for o in as_overrides(tiny_config(tmp_path / "run")) if o.startswith(("data.", "out_dir="))]
    shortened = ["model.n_layer=1", "model.vocab_size=300", "train.max_steps=2", "train.batch_size=1",
                 "train.global_batch=2", "train.seq_len=32", "train.warmup_steps=1", "train.log_interval=1",
                 "train.eval_interval=0", "train.eval_steps=1", "train.compile=false", "logger=none"]
    assert one_line_errors.run_script(monkeypatch, "train", f"model={model}", "recipe=gpu", *data,
                                      *shortened) is None
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["train"] | {"optimizer": "muon", "lr": 1.8e-3, "schedule": "wsd", "global_batch": 2,
                             "grad_accum": 2} == saved["train"]
    torch.manual_seed(0)
    with torch.device("meta"):
        parameters = sum(p.numel() for p in GPT(RunConfig.from_dict(saved).model).parameters())
    assert f"model: {parameters:,} parameters" in capsys.readouterr().err
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2]
