"""The training loop through the library: run directory, evaluation, resume, stops and bad input."""

import json
import math
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
import yaml
from safetensors.torch import load_file

import nanoattn.train.step as step
from nanoattn import kernels, load_checkpoint
from nanoattn.checkpoint import CheckpointError, load_trainer_state, read_checkpoint_config
from nanoattn.config import RunConfig, TrainConfig
from nanoattn.config.options import RECIPES
from nanoattn.data import TokenData, bits_per_byte, data_dir
from nanoattn.logging import read_metrics
from nanoattn.train import TrainingDiverged, train


def test_a_run_writes_the_documented_run_directory(tmp_path, tiny_config):
    run_dir = train(tiny_config(tmp_path / "run"))
    assert run_dir == tmp_path / "run"
    assert sorted(p.name for p in run_dir.iterdir()) == ["checkpoints", "config.yaml", "data.json",
                                                         "metrics.jsonl", "tokenizer.json"]
    data = TokenData(data_dir(RunConfig.from_dict(tiny_config(tmp_path)).data))
    assert (run_dir / "tokenizer.json").read_text() == data.tokenizer.to_str()  # the run's snapshot
    assert json.loads((run_dir / "data.json").read_text())["fingerprint"] == data.meta["fingerprint"]
    records = read_metrics(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, 13))
    for r in records:
        assert {"step", "train_loss", "lr", "tokens", "tok_per_s"} <= r.keys()
        assert r["tokens"] == r["step"] * 4 * 32
    evals = [r for r in records if "val_loss" in r]
    assert [r["step"] for r in evals] == [4, 8, 12]
    for r in evals:
        assert r["val_bpb"] == pytest.approx(bits_per_byte(r["val_loss"], data.bytes_per_token))
    assert records[-1]["train_loss"] < records[0]["train_loss"]

    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["000004", "000008", "000012", "latest"]
    assert (ckpts / "latest").read_text() == "000012\n"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "trainer_state.pt"):
        assert (ckpts / "000012" / name).is_file()
    state = load_trainer_state(run_dir)
    assert state["step"] == 12 and {"optimizer", "rng", "window", "data"} <= state.keys()
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["model"]["vocab_size"] == 257  # raised from 64 to the byte tokenizer's 257
    assert RunConfig.from_dict(saved).train.max_steps == 12
    ckpt = load_checkpoint(run_dir)
    assert (ckpt.step, ckpt.train_seq_len, ckpt.config.vocab_size) == (12, 32, 257)


def test_val_loss_equals_an_independent_evaluation_of_the_checkpoint(tmp_path, tiny_config):
    cfg = tiny_config(tmp_path / "run", eval_steps=3)
    run_dir = train(cfg)
    data = TokenData(data_dir(RunConfig.from_dict(cfg).data))
    model = load_checkpoint(run_dir).model
    with torch.no_grad():
        losses = [model.loss(x, y).item() for x, y in data.val_batches(3, batch_size=4, seq_len=32)]
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["val_loss"] == pytest.approx(sum(losses) / 3, abs=1e-6)


def test_global_batch_sets_the_micro_steps_for_the_processes_at_hand(tmp_path, tiny_config, compare_runs):
    """train.global_batch=8 at batch_size 2: 4 micro-steps on one process (2 on two, 1 on four), the
    very run that grad_accum=4 gives, and config.yaml records the micro-steps it took."""
    given = train(tiny_config(tmp_path / "global", batch_size=2, global_batch=8, max_steps=4))
    stated = train(tiny_config(tmp_path / "stated", batch_size=2, grad_accum=4, max_steps=4))
    compare_runs(given, stated, 0.0)
    saved = yaml.safe_load((given / "config.yaml").read_text())["train"]
    assert (saved["global_batch"], saved["grad_accum"]) == (8, 4)
    t = TrainConfig(batch_size=2, global_batch=8)
    assert [t.for_processes(n).grad_accum for n in (1, 2, 4)] == [4, 2, 1]
    assert t.for_processes(1).for_processes(1).grad_accum == 4  # a run's recorded config, read back
    with pytest.raises(ValueError, match=re.escape(
            "train.global_batch=8 is invalid: must be a multiple of train.batch_size x processes = 2 x 3")):
        t.for_processes(3)
    with pytest.raises(ValueError, match=re.escape("train.grad_accum=3 is invalid: must be 1 with "
                                                   "train.global_batch=8: it follows from it (4 on 1")):
        TrainConfig(batch_size=2, global_batch=8, grad_accum=3).for_processes(1)
    with pytest.raises(ValueError, match=re.escape(
            "train.global_batch=9 is invalid: must be a multiple of train.batch_size=2")):
        TrainConfig(batch_size=2, global_batch=9)


def test_a_larger_vocab_is_kept_as_padding(tmp_path, tiny_config):
    run_dir = train(tiny_config(tmp_path / "run", model={"vocab_size": 300}, max_steps=1))
    assert load_checkpoint(run_dir).config.vocab_size == 300


def sigterm_once():
    """An action for ``_inject``: SIGTERM to this process the first time only (a second signal would
    interrupt the run at once instead of letting it save)."""
    sent = {"done": False}

    def action(loss):
        if not sent["done"]:
            sent["done"] = True
            os.kill(os.getpid(), signal.SIGTERM)
        return loss

    return action


def _inject(monkeypatch, on_call, action):
    """Run ``action(loss)`` on the on_call-th training micro-batch (1-based)."""
    original = step.LossModule.forward
    calls = {"n": 0}

    def forward(self, x, y):
        calls["n"] += 1
        loss = original(self, x, y)
        return action(loss) if calls["n"] >= on_call else loss

    monkeypatch.setattr(step.LossModule, "forward", forward)
    return calls


@pytest.mark.parametrize(("optimizer", "task"), [("adamw", None), ("muon", None), ("adamw", "flip_flop")])
def test_sigterm_checkpoints_and_the_resumed_run_equals_an_uninterrupted_one(
        tmp_path, tiny_config, monkeypatch, compare_runs, optimizer, task):
    # dropout (RNG state), gradient accumulation, a log window open at the stop and the optimizer's
    # state (Muon's momentum buffers too) all must survive; a task run draws the same instances.
    options = dict(model={"dropout": 0.1}, grad_accum=2, log_interval=3, eval_interval=6, ckpt_interval=100,
                   optimizer=optimizer)

    def config(out_dir, **more):
        return {**tiny_config(out_dir, **options, **more), "task": {"name": task, "train_length": 8}}

    reference = train(config(tmp_path / "reference"))
    calls = _inject(monkeypatch, 9, sigterm_once())  # micro-batch 9 = the first of update 5
    run_dir = train(config(tmp_path / "run"))
    assert calls["n"] == 10  # update 5 finished, then it stopped
    assert (run_dir / "checkpoints" / "latest").read_text() == "000005\n"
    assert load_trainer_state(run_dir)["window"]["count"] == 4  # updates 4 and 5, 2 micro-batches each
    monkeypatch.undo()
    train(config(tmp_path / "run", resume=True))
    compare_runs(run_dir, reference, 1e-6)


def test_a_resume_on_another_thread_count_says_its_losses_continue_to_rounding(tmp_path, tiny_config, capsys):
    """Kernels split their sums by the thread count: each save records the run's count, a resume on
    the same count says nothing more, and one on another names both and the setting that is exact."""
    threads = torch.get_num_threads()
    run_dir = train(tiny_config(tmp_path / "run", max_steps=2, ckpt_interval=2))
    assert load_trainer_state(run_dir)["threads"] == threads
    train(tiny_config(tmp_path / "run", max_steps=3, ckpt_interval=3, resume=True))
    said = capsys.readouterr().err
    assert "at step 2" in said and "thread(s)" not in said
    try:
        torch.set_num_threads(threads + 1)
        train(tiny_config(tmp_path / "run", max_steps=4, ckpt_interval=4, resume=True))
    finally:
        torch.set_num_threads(threads)
    said = capsys.readouterr().err
    assert (f"at step 3; on {threads + 1} thread(s) where it saved on {threads}, so its losses continue to "
            f"rounding, not to the bit (OMP_NUM_THREADS={threads} resumes it exactly)") in said


def test_a_resume_takes_the_runs_own_kernels_whatever_the_cache_holds_then(
        tmp_path, tiny_config, monkeypatch, fresh_attention_timings, compare_runs):
    """bf16 attention is two matmuls or SDPA, whichever the machine's kernel cache says is faster, and
    the two round differently. A run killed, then resumed after its cache was altered (each choice
    flipped) and after it was deleted, trains the uninterrupted run's losses to the bit: each
    checkpoint records the choices its run took, and a resume takes them before it computes."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("NANOATTN_CACHE", str(cache))
    choices = cache / kernels.KERNEL_CHOICES

    def as_a_new_process():
        monkeypatch.setattr(kernels, "_kernel_choices", {})
        kernels.bf16_attention_timing.cache_clear()

    def config(out_dir, **more):
        return tiny_config(out_dir, dtype="bfloat16", ckpt_interval=100, **more)

    as_a_new_process()
    reference = train(config(tmp_path / "reference"))
    taken = json.loads(choices.read_text())
    recorded = load_trainer_state(reference)["kernel_choices"]
    assert recorded == {f"{machine} {key}": name for machine, keys in taken.items()
                        for key, name in keys.items()}
    other = {"bf16 matmuls": "sdpa", "sdpa": "bf16 matmuls"}
    flipped = {machine: {key: other[name] for key, name in keys.items()} for machine, keys in taken.items()}
    choices.write_text(json.dumps(flipped))
    as_a_new_process()
    with pytest.raises(AssertionError):  # the other kernels train other losses: the test can tell
        compare_runs(train(config(tmp_path / "other")), reference, 0)
    # Killed at update 5 and resumed with the flipped cache, killed at update 9 and resumed without one.
    choices.write_text(json.dumps(taken))
    for update, resume, change_cache in ((5, False, lambda: choices.write_text(json.dumps(flipped))),
                                         (4, True, choices.unlink)):
        as_a_new_process()
        with pytest.MonkeyPatch.context() as patch:
            _inject(patch, update, sigterm_once())
            train(config(tmp_path / "run", resume=resume))
        change_cache()
    as_a_new_process()
    train(config(tmp_path / "run", resume=True))
    compare_runs(tmp_path / "run", reference, 0)
    assert not choices.exists()  # nothing was measured again


def test_a_task_run_at_random_positions_still_checks_its_task_at_1x(tmp_path, tiny_config):
    """The positions wrap the task's batches; the 1x check still scores the task at 0..T-1."""
    run = train({**tiny_config(tmp_path / "run", max_steps=2, eval_interval=2, random_positions=64),
                 "task": {"name": "parity", "train_length": 2}})
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl") if "exact_1x" in r] == [2]


def test_a_task_run_stops_at_its_accuracy_and_a_run_killed_before_stops_there_too_when_resumed(
        tmp_path, tiny_config, monkeypatch, compare_runs):
    # Parity of 1-2 bits: the first evaluations get no answer right, later ones the format and about
    # half the bits, so 0.3 is reached within the budget and never at the first evaluation.
    def config(out_dir, **more):
        fields = dict(max_steps=60, lr=0.01, log_interval=2, eval_interval=4, ckpt_interval=100,
                      stop_at_accuracy=0.3)
        return {**tiny_config(out_dir, **{**fields, **more}), "task": {"name": "parity", "train_length": 2}}

    reference = train(config(tmp_path / "reference"))
    stopped = read_checkpoint_config(reference)
    checks = [r for r in read_metrics(reference / "metrics.jsonl") if "exact_1x" in r]
    assert 4 < stopped["step"] < 60 and checks[-1]["step"] == stopped["step"]
    assert stopped["exact_1x"] == checks[-1]["exact_1x"] >= 0.3 > max(r["exact_1x"] for r in checks[:-1])

    _inject(monkeypatch, 3, sigterm_once())
    run = train(config(tmp_path / "run"))
    assert read_checkpoint_config(run)["step"] == 3 and "exact_1x" not in read_checkpoint_config(run)
    monkeypatch.undo()
    train(config(tmp_path / "run", resume=True))
    assert read_checkpoint_config(run) == stopped
    compare_runs(run, reference, 0.0)
    weights = [load_file(r / "checkpoints" / f"{stopped['step']:06d}" / "model.safetensors")
               for r in (run, reference)]
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[1])
    records = (run / "metrics.jsonl").read_text()
    train(config(tmp_path / "run", resume=True))  # resumed again: nothing is left to train
    assert (run / "metrics.jsonl").read_text() == records


def test_a_non_finite_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, tiny_config,
                                                                           monkeypatch):
    _inject(monkeypatch, 6, lambda loss: loss * float("nan"))  # update 6 on: NaN
    with pytest.raises(TrainingDiverged, match="non-finite") as err:
        train(tiny_config(tmp_path / "run", ckpt_interval=2))
    assert "000004" in str(err.value) and "\n" not in str(err.value)
    ckpts = tmp_path / "run" / "checkpoints"
    assert (ckpts / "latest").read_text() == "000004\n"
    assert not (ckpts / "000006").exists()
    model = load_checkpoint(tmp_path / "run").model
    assert all(torch.isfinite(p).all() for p in model.parameters())
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert all(math.isfinite(r["train_loss"]) for r in records)


def test_resuming_a_different_run_names_the_differing_key(tmp_path, tiny_config):
    train(tiny_config(tmp_path / "run", max_steps=4))
    with pytest.raises(ValueError, match=r"holds a different run: train\.lr=0\.003 there, 0\.01 now"):
        train(tiny_config(tmp_path / "run", resume=True, lr=0.01))
    with pytest.raises(ValueError, match=r"model\.d_model"):
        train(tiny_config(tmp_path / "run", resume=True, model={"d_model": 64}))
    # keys that may change: a longer run, other intervals, the attention kernel (the same function)
    train(tiny_config(tmp_path / "run", resume=True, max_steps=6, eval_interval=3, keep_last=1,
                      model={"attn_kernel": "sdpa"}))
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["000006", "latest"]


def test_a_run_written_before_a_field_existed_resumes_under_its_declared_default(tmp_path, tiny_config,
                                                                                  compare_runs):
    """A config.yaml from an older version lacks the newer keys; the run had their defaults."""
    def config(name, **fields):  # a constant rate: the 4-step run continued to 8 is the 8-step run
        return tiny_config(tmp_path / name, ckpt_interval=4, schedule="constant", **fields)

    reference = train(config("reference", max_steps=8))
    train(config("run", max_steps=4))
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    del saved["model"]["value_embeds"], saved["model"]["attn_kernel"], saved["train"]["head_lr_scale"]
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(saved))
    with pytest.raises(ValueError, match=r"different run: .*train\.head_lr_scale=1\.0 there, 0\.5 now"):
        train(config("run", resume=True, max_steps=8, head_lr_scale=0.5, model={"tie_embeddings": False}))
    train(config("run", resume=True, max_steps=8))
    compare_runs(tmp_path / "run", reference, 1e-6)


def test_a_fresh_run_never_overwrites_an_existing_run(tmp_path, tiny_config):
    train(tiny_config(tmp_path / "run", max_steps=4))
    before = (tmp_path / "run" / "checkpoints" / "000004" / "model.safetensors").read_bytes()
    with pytest.raises(ValueError, match="already holds a run"):
        train(tiny_config(tmp_path / "run", max_steps=4))
    assert (tmp_path / "run" / "checkpoints" / "000004" / "model.safetensors").read_bytes() == before


def test_resume_errors_are_one_line(tmp_path, tiny_config):
    with pytest.raises(ValueError, match="holds no run"):
        train(tiny_config(tmp_path / "empty", resume=True))
    with pytest.raises(CheckpointError, match="does not exist"):
        train(tiny_config(tmp_path / "x", resume=str(tmp_path / "missing")))
    train(tiny_config(tmp_path / "run", max_steps=8))
    with pytest.raises(ValueError, match="older than its run's latest checkpoint 000008"):
        train(tiny_config(tmp_path / "x", resume=str(tmp_path / "run" / "checkpoints" / "000004")))
    (tmp_path / "run" / "checkpoints" / "000008" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="corrupt") as err:
        train(tiny_config(tmp_path / "run", resume=True, max_steps=10))
    assert "\n" not in str(err.value)
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text() == "000008\n"


def test_resume_refuses_a_pickle_payload_without_running_it(tmp_path, tiny_config):
    import pathlib

    class Payload:
        def __reduce__(self):
            return (pathlib.Path.touch, (tmp_path / "pwned",))

    run_dir = train(tiny_config(tmp_path / "run", max_steps=4))
    state_file = run_dir / "checkpoints" / "000004" / "trainer_state.pt"
    torch.save({**torch.load(state_file, weights_only=True), "x": Payload()}, state_file)
    with pytest.raises(CheckpointError, match="refused") as err:
        train(tiny_config(tmp_path / "run", resume=True, max_steps=6))
    assert not (tmp_path / "pwned").exists() and "\n" not in str(err.value)


def test_a_run_killed_before_its_first_checkpoint_restarts_from_step_0(tmp_path, tiny_config, compare_runs):
    cfg = tiny_config(tmp_path / "run", max_steps=4, ckpt_interval=0)
    reference = train(tiny_config(tmp_path / "reference", max_steps=4, ckpt_interval=0))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(
        {**yaml.safe_load((reference / "config.yaml").read_text()), "out_dir": str(tmp_path / "run")}))
    (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1, "train_loss": 9.0}\n{"step": 2, "tra')
    train({**cfg, "train": {**cfg["train"], "resume": True}})
    compare_runs(tmp_path / "run", reference, 1e-6)


def test_init_from_starts_from_the_weights_with_the_context_fields_of_the_new_config(tmp_path, tiny_config):
    source = train(tiny_config(tmp_path / "source", max_steps=12))
    source_loss = read_metrics(source / "metrics.jsonl")[-1]["train_loss"]
    cfg = tiny_config(tmp_path / "long", max_steps=2, seq_len=64, init_from=str(source),
                      model={"d_model": 48, "max_seq_len": 64, "attn_kernel": "sdpa",
                             "rope_scaling": {"type": "linear", "factor": 2.0}})
    run_dir = train(cfg)
    model = load_checkpoint(run_dir).config
    # the shape from the checkpoint; the length and the attention kernel from cfg
    assert (model.d_model, model.max_seq_len, model.attn_kernel) == (32, 64, "sdpa")
    assert model.rope_scaling["original_max_seq_len"] == 32
    first = read_metrics(run_dir / "metrics.jsonl")[0]
    assert first["step"] == 1 and first["train_loss"] < source_loss + 0.5 < math.log(257)


def test_init_from_a_tied_checkpoint_refuses_a_head_rate_of_its_own(tmp_path, tiny_config):
    """The default recipe unties the head and sets its rate apart; a tied checkpoint keeps its tie,
    and the error says that the tie is the checkpoint's."""
    source = train(tiny_config(tmp_path / "source", max_steps=2, ckpt_interval=0))
    cfg = tiny_config(tmp_path / "tuned", max_steps=2, init_from=str(source), head_lr_scale=0.3,
                      model={"tie_embeddings": False})
    message = (f"train.head_lr_scale=0.3 is invalid: must be 1 with model.tie_embeddings=true (the model of "
               f"train.init_from='{source}')")
    with pytest.raises(ValueError, match=re.escape(message)):
        train(cfg)
    assert not (tmp_path / "tuned").exists()


def test_importing_nanoattn_imports_neither_wandb_hydra_nor_datasets():
    """Nor matplotlib: a training process draws no figure and would pay its import at every start. Nor
    Dynamo, whose import is most of torch's own: only torch.compile imports it, and only models with an
    abacus build one (its check runs between graphs); the meta model every script checks its memory
    with is built without torch.nn.init's fills, whose meta forms would import it."""
    modules = ("wandb", "hydra", "datasets", "omegaconf", "matplotlib", "torch._dynamo")
    code = ("import sys, nanoattn, nanoattn.train, nanoattn.logging, nanoattn.generate; "
            "from nanoattn.model import meta_model; meta_model(nanoattn.ModelConfig()); "
            f"print(sorted(m for m in {modules!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_run_at_random_positions_resumes_exactly(tmp_path, tiny_config, compare_runs):
    """Ruoss et al.'s positions are drawn from seeds of the step: a resumed run draws the same ones."""
    def config(name, **fields):
        return tiny_config(tmp_path / name, ckpt_interval=4, schedule="constant", random_positions=256,
                           **fields)

    reference = train(config("reference", max_steps=8))
    train(config("run", max_steps=4))
    train(config("run", resume=True, max_steps=8))
    compare_runs(tmp_path / "run", reference, 1e-6)
    plain = train(tiny_config(tmp_path / "plain", ckpt_interval=4, schedule="constant", max_steps=8))
    first = [read_metrics(run / "metrics.jsonl")[0]["train_loss"] for run in (reference, plain)]
    assert first[0] != first[1]  # the positions reached the model


def test_a_compiled_run_trains_the_same_losses_within_bf16_rounding_caches_its_kernels_and_sums_in_order(
        tmp_path, tiny_config, monkeypatch, capsys):
    """torch.compile changes how the step is computed, not what: fused kernels keep some float32
    intermediates that eager rounds to bf16, so each step's loss may move by bf16's rounding unit
    (2^-8 relative), never more. The kernels land in the compile cache, the run names it.

    Inductor compiles an embedding lookup's backward pass (token shift's too) to atomic adds, summed
    in the order the threads reach them: a compiled run then neither repeats itself nor resumes
    exactly. The training step compiles with torch's deterministic algorithms, which send that sum to
    the library's kernel, so no kernel generated for the default recipe's model holds an atomic add.
    Code for one thread sums serially, so it is generated for two."""
    cache = tmp_path / "inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(cache))  # generated here, not loaded
    monkeypatch.setattr(torch._inductor.config.cpp, "threads", 2)
    losses, model = {}, {**RECIPES["default"]["model"], "n_layer": 1}  # a layer's kernels are every layer's
    for compiled in (False, True):
        run_dir = train(tiny_config(tmp_path / str(compiled), model=model, dtype="bfloat16", compile=compiled,
                                    max_steps=6, eval_interval=0, ckpt_interval=0))
        records = read_metrics(run_dir / "metrics.jsonl")
        losses[compiled] = [r["train_loss"] for r in records if "train_loss" in r]
    assert len(losses[True]) == 6
    assert losses[True] == pytest.approx(losses[False], rel=2**-8)
    assert f"the kernels are cached in {cache}" in capsys.readouterr().err
    kernels = [path.read_text() for path in cache.rglob("*.py")]  # Inductor's code, kept for the next run
    assert any("cpp_fused" in code for code in kernels)
    assert not any("atomic_add" in code for code in kernels)
