"""The training loop: ``train(cfg) -> run directory``.

Design choices:
- Step semantics: ``step`` counts finished optimizer updates. Update ``s`` (0-based) uses the
  batches ``TokenData.train_batch(s, micro_step=m, rank=r, world_size=w)``, a pure function, and
  the learning rate ``lr_at(s)``, a pure function; checkpoint ``N`` holds the state after N updates.
  So an exact resume needs only the weights, the optimizer moments, the step and the RNG states
  (dropout), all of which a checkpoint holds. The open log window (loss sum and count) is saved
  too, so a resumed run writes the same ``train_loss`` records as an uninterrupted one.
- No host-device synchronisation per micro-step: losses and gradient-norm checks accumulate on
  the device and are read once per log window, evaluation or checkpoint. A non-finite loss or
  gradient norm stops the run there, before any checkpoint could store the bad weights.
- One record per log window (every ``log_interval`` steps, and at every evaluation and at the
  end): ``step, train_loss, lr, tokens, tok_per_s, grad_norm``; evaluation records add
  ``val_loss``, ``val_bpb`` and ``max_attn_logit`` (``GPT.max_attention_logit`` on this rank's
  slice of the first validation batch). ``train_loss`` is the mean over the window's micro-batches.
- Evaluation uses fixed validation windows (``TokenData.val_batches``), the same in every run and
  at every step; like a training batch, each of the ``eval_steps`` batches has
  batch_size x world_size rows split over the ranks, so val_loss is comparable across runs.
- What a run trains on (the corpus, or a task's instances, and their wrappers) is ``run_data``'s.
  A task run's ``val_loss`` is the answer tokens' loss, and its evaluations add ``exact_1x``: exact
  match on fresh instances of the 1x bin (``nanoattn.eval.tasks``), the task lab's "learned".
- ``train.stop_at_accuracy``: a task run ends at the first evaluation whose ``exact_1x`` reaches
  it. That checkpoint records the value in its config.json, which is how a run stopped there is
  told from one cut short at the same step (``reached_accuracy``); resumed, such a run trains no
  further unless the target was raised. The check's instances are a pure function of the step and
  the weights are exactly restored, so a resumed run stops where an uninterrupted one does.
- A batch is (x, y), or (x, y, positions) when its data gives each token its own position
  (position coupling, ``train.random_positions``): everything here passes the tuple on whole.
- bf16 autocast (fp32 master weights and optimizer state) where the hardware has fast bf16:
  CUDA GPUs that support it, and CPUs with native bf16 matmul instructions, AMX (``amx_bf16``)
  or AVX512-BF16 (``avx512_bf16``), read from /proc/cpuinfo. Without them bf16 is emulated and
  slower than float32.
- Under torchrun (DDP), rank 0 chooses the run directory and writes every file; each rank draws
  its own slice of the global batch and its own dropout stream; checkpoints gather all ranks'
  RNG states. Only the loss goes through DDP's forward (``step.LossModule``), so DDP syncs gradients.
- SIGINT / SIGTERM: the current step finishes, a checkpoint is written and ``train`` returns.
  A second signal interrupts immediately.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import math
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from nanoattn.checkpoint import (
    load_trainer_state,
    load_weights,
    read_checkpoint_config,
    read_run_config,
    remove_stale_temps,
    resolve_checkpoint,
    save_checkpoint,
)
from nanoattn.config import RunConfig
from nanoattn.data import bits_per_byte
from nanoattn.data.tasks import CHECK_STREAM
from nanoattn.eval.tasks import DEFAULT_PER_BIN, evaluate_task
from nanoattn.logging import duration_text, make_logger, note, truncate_metrics
from nanoattn.model import GPT
from nanoattn.runtime import (
    autocast,
    autocast_dtype,
    compile_choice,
    exclusive_lock,
    pick_device,
    use_compile_cache,
    write_atomic,
)
from nanoattn.train import distributed
from nanoattn.train.optim import lr_at, optimizer_for
from nanoattn.train.run_data import training_data
from nanoattn.train.run_dir import (
    RUN_TOKENIZER,
    check_run_tokenizer,
    check_same_run,
    locate_run,
    reached_accuracy,
    resolve_init_from,
    run_directory_for,
    snapshot_tokenizer,
    undo_failed_start,
)
from nanoattn.train.signals import StopSignals
from nanoattn.train.step import check_step_fits, optimizer_step, wrap_for_training
from nanoattn.train.trainer_state import (
    check_resumable,
    gathered_rng_states,
    seed_rngs,
    thread_count_change,
    trainer_state,
)


class TrainingDiverged(RuntimeError):
    """The loss or gradient norm became non-finite; the last good checkpoint is kept."""


def train(cfg: RunConfig | dict[str, Any]) -> Path:
    """Train a model as ``cfg`` says and return its run directory (see docs/training.md).

    With ``train.init_from`` the model is the checkpoint's, with the ``INIT_OVERRIDABLE`` fields of
    ``cfg.model`` on top. From a mapping only the model keys it names count, and a ``rope_scaling``
    without ``original_max_seq_len`` gets the checkpoint's original length; a ``ModelConfig`` is
    taken as a full request (its scaling's original length defaults to its own ``max_seq_len``).
    """
    cfg = resolve_init_from(cfg)
    device = pick_device(cfg.train.device, "train.device")
    cfg = dataclasses.replace(cfg, train=cfg.train.for_processes(distributed.launched_world_size()))
    check_step_fits(cfg, device)
    dist = distributed.init_distributed(device.type)
    if device.type == "cuda":
        device = torch.device("cuda", dist.local_rank)
    try:
        run_dir = _Run(cfg, device, dist).run()
        # Every rank finished before any tears the group down: a gloo peer that is still inside
        # the group when the other destroys it can abort at exit (seen once in CI: SIGABRT).
        distributed.barrier(dist)
        return run_dir
    finally:
        # DDP's reducer sits in reference cycles (its autograd hooks): free it while its process
        # group still exists, not at interpreter exit after the group is gone.
        gc.collect()
        distributed.shutdown(dist)


class _Run:
    def __init__(self, cfg: RunConfig, device: torch.device, dist: distributed.Dist) -> None:
        self.cfg, self.device, self.dist = cfg, device, dist
        self.t = cfg.train
        self.seq_len = cfg.seq_len
        amp_dtype, self.amp_reason = autocast_dtype(self.t.dtype, device)
        self.compiled, self.compile_reason = compile_choice(self.t.compile, device)
        self.autocast = lambda: autocast(device, amp_dtype)
        self.started = False  # this process wrote the run's config.yaml

    def say(self, text: str) -> None:
        if self.dist.is_main:
            note(text)

    # ------------------------------------------------------------------ run

    def run(self) -> Path:
        """Rank 0 holds the run directory's lock for the whole run, from before anything is read."""
        with contextlib.ExitStack() as stack:
            if self.dist.is_main:
                run_dir = run_directory_for(self.cfg.out_dir, self.t.resume)
                stack.enter_context(exclusive_lock(run_dir, f"run directory {run_dir}"))
            try:
                return self._run()
            except BaseException:
                if self.started and undo_failed_start(run_dir):  # rank 0 only starts a run
                    self.say(f"{run_dir}: the run failed before it trained; its files are removed")
                raise

    def _run(self) -> Path:
        cfg, t, d = self.cfg, self.t, self.dist
        torch.manual_seed(t.seed)  # the same initial weights on every rank
        located = locate_run(cfg.out_dir, t.resume) if d.is_main else None
        run_dir, ckpt = distributed.broadcast_object(d, located)
        run_dir = Path(run_dir)
        data, self.task_data, self.seq_len = training_data(cfg, d, self.say)
        state = load_trainer_state(ckpt) if ckpt is not None else None
        if state is not None:
            check_resumable(state, ckpt, d.world_size, t.batch_size)
        # The checkpoint resumed from ended its run at its accuracy: nothing is left to train.
        self.reached = state is not None and reached_accuracy(read_checkpoint_config(ckpt),
                                                              t.stop_at_accuracy)
        if d.is_main:
            saved = dataclasses.replace(cfg, out_dir=str(run_dir)).to_dict()
            if (run_dir / "config.yaml").exists():
                check_same_run(read_run_config(run_dir), saved, run_dir)
            check_run_tokenizer(run_dir, data, ckpt)
            self.started = True  # from here a failure before training takes the run's files back
            write_atomic(run_dir / "config.yaml", yaml.safe_dump(saved, sort_keys=False))
            snapshot_tokenizer(run_dir, data)
            remove_stale_temps(run_dir / "checkpoints")
            truncate_metrics(run_dir / "metrics.jsonl", state["step"] if state else 0)
        distributed.barrier(d)

        with torch.device(self.device):
            model = GPT(cfg.model)
        model.train()
        optimizer = optimizer_for(model, t, self.device)
        start = 0
        if state is not None:
            load_weights(ckpt, model)
            optimizer.load_state_dict(state["optimizer"])
            start = int(state["step"])
            self.say(f"resumed from {ckpt} at step {start}"
                     + thread_count_change(state, torch.get_num_threads()))
        else:
            if t.resume is not False:
                self.say(f"train.resume: {run_dir} has no checkpoint yet, starting again from step 0")
            if t.init_from is not None:
                load_weights(t.init_from, model)
                self.say(f"init_from: the weights of {resolve_checkpoint(t.init_from)}, "
                         "a fresh optimizer, step 0")
        seed_rngs(state, self.t.seed, self.dist, self.device)

        net = wrap_for_training(model, ddp=d.enabled, compile=self.compiled, device=self.device)

        self.model, self.net, self.optimizer, self.data = model, net, optimizer, data
        self.run_dir, self.ckpt_root = run_dir, run_dir / "checkpoints"
        # Validation batches are global like training batches (batch_size x world_size rows, this
        # rank's slice), so the windows do not depend on how many processes share them.
        rows = slice(d.rank * t.batch_size, (d.rank + 1) * t.batch_size)
        self.val = [tuple(part[rows] for part in batch) for batch in data.val_batches(
            t.eval_steps, batch_size=t.batch_size * d.world_size, seq_len=self.seq_len)]
        self.tokens_per_step = t.batch_size * t.grad_accum * d.world_size * self.seq_len
        self._describe(model, run_dir, start)
        logger = make_logger(cfg.logger, run_dir, config=cfg.to_dict(), total_steps=t.max_steps,
                             initial_step=start) if d.is_main else None
        try:
            step, last_val = self._loop(start, state, logger)
        finally:
            if logger is not None:
                logger.close()
        if self.reached:
            exact = f" ({last_val['exact_1x']:.3f})" if last_val else ""
            self.say(f"stopped at step {step}: exact match at 1x{exact} reached train.stop_at_accuracy="
                     f"{t.stop_at_accuracy}")
        if step == t.max_steps or self.reached:
            self._summary(step, start, last_val)
        else:
            self.say(f"stopped at step {step}; continue it with its overrides and train.resume={run_dir}")
        return run_dir

    def _describe(self, model: GPT, run_dir: Path, start: int) -> None:
        t, d = self.t, self.dist
        self.say(f"run dir {run_dir}")
        self.say(f"model: {model.num_params():,} parameters ({model.num_params(exclude_embeddings=True):,} "
                 f"without embeddings), pos={self.cfg.model.pos}, {self.cfg.model.n_layer} layers, "
                 f"d_model={self.cfg.model.d_model}, {self.cfg.model.n_head} heads / "
                 f"{self.cfg.model.n_kv_head} kv heads")
        self.say(f"train: {t.max_steps - start} steps on {self.device} ({self.amp_reason}, "
                 f"{self.compile_reason}), global batch "
                 f"{t.batch_size} x {t.grad_accum} x {d.world_size} x {self.seq_len} = "
                 f"{self.tokens_per_step:,} tokens, {t.schedule} lr {t.lr:g}")

    # ------------------------------------------------------------------ loop

    def _loop(self, start: int, state: dict[str, Any] | None, logger) -> tuple[int, dict[str, float]]:
        """Train from step ``start``; returns (the step reached, the last evaluation)."""
        t, d = self.t, self.dist
        window = state["window"] if state is not None else {"loss_sum": torch.zeros(()), "count": 0,
                                                             "bad": torch.zeros((), dtype=torch.bool)}
        loss_sum = window["loss_sum"].to(self.device)  # float32 sum of micro-batch losses
        count = int(window["count"])
        bad = window["bad"].to(self.device)  # any non-finite gradient norm in the window
        grad_norm = torch.zeros((), device=self.device)
        if self.compiled:
            self.say("compiling the training step: its first call traces and compiles it (seconds to a "
                     f"minute; the kernels are cached in {use_compile_cache()} for later runs)")
        self._started = t0 = time.perf_counter()
        window_start = start
        last_val: dict[str, float] = {}
        step = start
        with StopSignals() as signals:
            while step < t.max_steps and not self.reached:
                lr = lr_at(step, lr=t.lr, min_lr=t.min_lr, warmup_steps=t.warmup_steps,
                           max_steps=t.max_steps, schedule=t.schedule, decay_fraction=t.decay_fraction,
                           decay_steps=t.decay_steps)
                for group in self.optimizer.param_groups:
                    # Checkpoints from before the optimizer choice carry no lr_scale: AdamW's, 1.
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                batches = [self.data.train_batch(step, batch_size=t.batch_size, seq_len=self.seq_len,
                                                 seed=t.seed, micro_step=micro, rank=d.rank,
                                                 world_size=d.world_size) for micro in range(t.grad_accum)]
                batches = [tuple(t.to(self.device, non_blocking=True) for t in batch)
                           for batch in batches]  # (x, y[, positions]) [B, T] each
                losses, grad_norm = optimizer_step(self.net, self.model, self.optimizer, batches,
                                                   grad_clip=t.grad_clip, autocast=self.autocast,
                                                   ddp=d.enabled)
                loss_sum += losses
                count += t.grad_accum
                bad |= ~torch.isfinite(grad_norm)
                step += 1
                if self.compiled and step == start + 1:
                    self.say(f"first step, compilation included: {time.perf_counter() - t0:.1f} s")

                final = step == t.max_steps
                # Under DDP the ranks agree on stopping through a collective, once per log window.
                stop = (not (d.enabled and step % t.log_interval)
                        and distributed.any_rank(d, signals.requested, self.device))
                evaluate = final or (t.eval_interval > 0 and step % t.eval_interval == 0)
                checkpoint = final or stop or (t.ckpt_interval > 0 and step % t.ckpt_interval == 0)
                measured: dict[str, float] = {}  # on this step's weights: kept in its checkpoint
                if evaluate or step % t.log_interval == 0:
                    now = time.perf_counter()
                    record = self._train_record(step, loss_sum, count, bad, grad_norm, lr,
                                                (step - window_start) * self.tokens_per_step / (now - t0))
                    if evaluate:
                        last_val = self._evaluate(step)
                        record.update(last_val)
                        measured = {k: last_val[k] for k in ("exact_1x",) if k in last_val}
                        self.reached = reached_accuracy(measured, t.stop_at_accuracy)
                    if logger is not None:
                        logger.log(record)
                    loss_sum.zero_()
                    bad.zero_()
                    count = 0
                    t0, window_start = time.perf_counter(), step
                if checkpoint or self.reached:
                    self._check_finite(step, loss_sum, bad)
                    self._save(step, {"loss_sum": loss_sum.detach().cpu(), "count": count,
                                      "bad": bad.detach().cpu()}, measured)
                if stop:
                    break
        return step, last_val

    def _check_finite(self, step: int, loss_sum: torch.Tensor, bad: torch.Tensor) -> None:
        flags = torch.stack([~torch.isfinite(loss_sum), bad]).float()
        if bool(distributed.all_reduce_sum(self.dist, flags).sum().item() > 0):
            latest = self.ckpt_root / "latest"
            kept = (f"the last good checkpoint is {self.ckpt_root / latest.read_text().strip()}"
                    if latest.exists() else "no checkpoint was written")
            raise TrainingDiverged(f"non-finite train loss or gradient norm by step {step}; {kept} "
                                   f"(try a lower train.lr, train.grad_clip, or train.dtype=float32)")

    def _train_record(self, step: int, loss_sum: torch.Tensor, count: int, bad: torch.Tensor,
                      grad_norm: torch.Tensor, lr: float, tok_per_s: float) -> dict[str, Any]:
        self._check_finite(step, loss_sum, bad)
        sums = distributed.all_reduce_sum(self.dist, torch.stack([loss_sum, grad_norm.float()]).clone())
        n = self.dist.world_size
        return {"step": step, "train_loss": sums[0].item() / (count * n), "lr": lr,
                "tokens": step * self.tokens_per_step, "tok_per_s": round(tok_per_s, 1),
                "grad_norm": sums[1].item() / n}

    @torch.no_grad()
    def _evaluate(self, step: int) -> dict[str, float]:
        """Mean loss over the fixed validation windows, each rank its slice of every batch."""
        self.model.eval()
        total = torch.zeros(2, dtype=torch.float64, device=self.device)  # [loss sum, batches]
        for batch in self.val:
            with self.autocast():
                loss = self.model.loss(*(t.to(self.device) for t in batch))
            total += torch.stack([loss.double(), torch.ones((), dtype=torch.float64, device=self.device)])
        x, _, *positions = (t.to(self.device) for t in self.val[0])
        with self.autocast():
            largest = self.model.max_attention_logit(x, *positions)
        self.model.train()
        loss_sum, n = distributed.all_reduce_sum(self.dist, total).tolist()
        val_loss = loss_sum / n
        if not math.isfinite(val_loss):
            raise TrainingDiverged(f"non-finite val_loss at step {step}; the last good checkpoint is kept")
        result = {"val_loss": val_loss, "val_bpb": bits_per_byte(val_loss, self.data.bytes_per_token),
                  "max_attn_logit": largest}
        if self.task_data is not None:
            result["exact_1x"] = self._exact_at_1x(step)
        return result

    def _exact_at_1x(self, step: int) -> float:
        """Exact match on ``DEFAULT_PER_BIN`` instances of the 1x bin drawn afresh for this step from the
        trainer's own stream. Every rank scores them all; all act on rank 0's value."""
        (at_1x,) = evaluate_task(self.model, self.task_data, factors=(1.0,), per_bin=DEFAULT_PER_BIN,
                                 seed=step, dtype=self.t.dtype, stream=CHECK_STREAM)
        return distributed.broadcast_object(self.dist, at_1x["exact"])

    def _save(self, step: int, window: dict[str, Any], measured: dict[str, float]) -> None:
        rng = gathered_rng_states(self.dist, self.device)
        if self.dist.is_main and not (self.ckpt_root / f"{step:06d}" / "model.safetensors").exists():
            state = trainer_state(step, self.optimizer, rng, window, self.t, self.dist.world_size)
            save_checkpoint(self.ckpt_root, f"{step:06d}", self.model, train_seq_len=self.seq_len, step=step,
                            tokenizer_file=self.run_dir / RUN_TOKENIZER, trainer_state=state,
                            keep_last=self.t.keep_last, measured=measured)
        distributed.barrier(self.dist)

    def _summary(self, step: int, start: int, last_val: dict[str, float]) -> None:
        seconds = time.perf_counter() - self._started
        tokens = (step - start) * self.tokens_per_step
        val = f"; val_loss {last_val['val_loss']:.4f}, val_bpb {last_val['val_bpb']:.4f}" if last_val else ""
        self.say(f"done: step {step}/{self.t.max_steps}, {tokens:,} tokens in {duration_text(seconds)} "
                 f"({tokens / max(seconds, 1e-9):,.0f} tok/s){val}; run dir {self.run_dir}")
