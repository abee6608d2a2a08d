"""Bounds before allocation: every integer field that sizes a tensor, set huge, is refused in one line
naming it before anything is allocated (or, where it sizes nothing, trains), under a memory limit that
turns any allocation it missed into an error; and a position id far past the others costs nothing.

One subprocess runs every case, its address space limited and ``memory_bytes`` told the same, so a
refusal does not depend on the machine and a missed bound fails fast instead of swapping.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from nanoattn.config import ModelConfig, TaskConfig, TrainConfig
from nanoattn.positional import encodings_with

HUGE = 10**12
# Integer fields that count steps, not elements: a huge one is a long run, which is the user's to ask.
STEP_COUNTS = {"max_steps", "warmup_steps", "decay_steps", "eval_interval", "log_interval", "ckpt_interval",
               "keep_last", "seed", "curriculum_steps"}
# What makes a field act: the fields set beside it.
ACTIVATE = {
    "t5_num_buckets": {"model": {"pos": "t5"}}, "t5_max_distance": {"model": {"pos": "t5"}},
    "fire_mlp_width": {"model": {"pos": "fire"}}, "cope_npos_max": {"model": {"pos": "cope"}},
    "abacus_max_offset": {"model": {"abacus": True}, "task": {"name": "addition"}},
    "temperature_floor_scale": {"model": {"pos": "nope"}},
    "mla_kv_rank": {"model": {"n_kv_head": None, "mla_rope_dim": 4}},
    "mla_q_rank": {"model": {"n_kv_head": None, "mla_kv_rank": 8, "mla_rope_dim": 4}},
    "mla_rope_dim": {"model": {"n_kv_head": None, "mla_kv_rank": 8}},
    "ffn_multiple_of": {"model": {"d_ff": None}}, "d_model": {"model": {"n_head": 1, "n_kv_head": 1}},
    "random_positions": {"model": {"pos": "rope"}},
    "train_length": {"task": {"name": "copy"}}, "train_examples": {"task": {"name": "copy"}},
    "max_position": {"task": {"name": "addition", "position_coupling": True}, "model": {"pos": "rope"}},
}
SECTIONS = {"model": ModelConfig, "train": TrainConfig, "task": TaskConfig}

SWEEP = """
import json, resource, sys
import torch
LIMIT = 6 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (LIMIT, LIMIT))
import nanoattn.runtime.device as device
device.memory_bytes = lambda d: LIMIT // 2
from nanoattn import GPT, ModelConfig
from nanoattn.train import train
base, cases, encodings = (json.loads(argument) for argument in sys.argv[1:4])
out = sys.argv[4]

def outcome(run):
    try:
        run()
        return "ran"
    except ValueError as e:
        return "refused: " + str(e)
    except BaseException as e:
        return f"{type(e).__name__}: {e}"

for section, key, value, extra in cases:
    cfg = json.loads(json.dumps(base))
    for part, fields in extra.items():
        cfg.setdefault(part, {}).update(fields)
    cfg.setdefault(section, {})[key] = value
    cfg["out_dir"] = f"{out}/{section}.{key}"
    print(json.dumps([f"{section}.{key}", outcome(lambda: train(cfg))]), flush=True)
for pos in encodings:
    model = GPT(ModelConfig(vocab_size=64, d_model=32, n_layer=1, n_head=2, d_ff=64, max_seq_len=32, pos=pos))
    positions = torch.tensor([[0, 10**12]])
    ran = outcome(lambda: model(torch.zeros(1, 2, dtype=torch.long), positions))
    print(json.dumps([f"positions {pos}", ran]), flush=True)
"""


def sized_fields() -> list[tuple[str, str]]:
    return [(section, f.name) for section, cls in SECTIONS.items() for f in dataclasses.fields(cls)
            if "int" in str(f.type) and "list" not in str(f.type) and f.name not in STEP_COUNTS]


def test_every_integer_field_set_huge_is_refused_in_one_line_naming_it_or_costs_nothing(tmp_path,
                                                                                         tiny_config):
    base = tiny_config(tmp_path / "unused", max_steps=1, eval_interval=0, eval_steps=1, ckpt_interval=0)
    cases = [(section, key, HUGE, ACTIVATE.get(key, {})) for section, key in sized_fields()]
    done = subprocess.run([sys.executable, "-c", SWEEP, json.dumps(base), json.dumps(cases),
                           json.dumps(encodings_with("takes_positions")), str(tmp_path)],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    outcomes = dict(json.loads(line) for line in done.stdout.splitlines() if line.startswith("["))
    assert len(outcomes) == len(cases) + len(encodings_with("takes_positions")), done.stderr[-2000:]
    for case, result in outcomes.items():
        assert result == "ran" or result.startswith("refused: "), (case, result)
        assert "\n" not in result, (case, result)
        field = case.rpartition(".")[2]
        if result.startswith("refused: ") and not case.startswith("positions"):
            assert field in result, (case, result)  # it names the field, not another one
    # Fields that size weights name themselves, not the layers (they did before).
    for field in ("canon", "abacus_max_offset", "fire_mlp_width", "cope_npos_max", "mla_kv_rank", "d_ff"):
        assert outcomes[f"model.{field}"].startswith(f"refused: model.{field}={HUGE} is invalid: "), field
    # Sizes nothing (before: the T5 buffer, the RoPE table and a batch list grew with them).
    for case in ("model.t5_max_distance", "train.random_positions", "task.max_position", "positions rope",
                 "positions pope"):
        assert outcomes[case] == "ran", (case, outcomes[case])
    for case in ("train.grad_accum", "train.eval_steps"):
        assert outcomes[case].startswith(f"refused: {case}={HUGE} is invalid: "), (case, outcomes[case])
