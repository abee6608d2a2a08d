"""The task scorer: exact match and per-token accuracy on hand-made predictions, bins, intervals."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from nanoattn.commands.eval_task import TaskEvalConfig
from nanoattn.commands.labs import TASK_LAB_ENCODINGS, TASK_LAB_TASKS, TaskLabConfig
from nanoattn.eval.tasks import DEFAULT_FACTORS, score_predictions, size_bins, task_table, wilson_interval
from nanoattn.model import IGNORE_INDEX
from nanoattn.validation import from_dict

I = IGNORE_INDEX


def test_exact_needs_every_answer_token_and_per_token_counts_each():
    targets = torch.tensor([[I, I, 5, 6, 0],
                            [I, 7, I, 8, 0],   # flip-flop-like: answers inside the row
                            [I, I, I, 9, 0]])
    predicted = torch.tensor([[3, 3, 5, 6, 0],  # all right (the non-answer positions do not count)
                              [1, 7, 2, 4, 0],  # one of three wrong
                              [9, 9, 9, 1, 1]])  # both wrong
    exact, correct, scored = score_predictions(predicted, targets)
    assert exact.tolist() == [True, False, False]
    assert correct.tolist() == [3, 2, 0] and scored.tolist() == [3, 3, 2]


def test_a_row_without_answer_tokens_is_an_error_not_a_free_match():
    with pytest.raises(ValueError, match="a row has no answer tokens"):
        score_predictions(torch.zeros(1, 3, dtype=torch.long), torch.full((1, 3), I))


def test_bins_are_consecutive_size_ranges_from_half_the_training_length():
    assert size_bins(16, (1, 1.5, 2, 3, 4)) == [(9, 16), (17, 24), (25, 32), (33, 48), (49, 64)]
    assert size_bins(128, (1, 2), min_size=100) == [(100, 128), (129, 256)]
    with pytest.raises(ValueError, match=r"factor 1.1 of train_length=4 holds no size of its own"):
        size_bins(4, (1, 1.1))
    with pytest.raises(ValueError, match=r"factors=\[2, 1\] is invalid: must be increasing positive finite"):
        size_bins(4, (2, 1))


def test_the_wilson_interval_is_within_five_points_at_400_instances_and_covers_the_estimate():
    low, high = wilson_interval(200, 400)
    assert high - low < 0.1 and low < 0.5 < high
    assert wilson_interval(0, 400)[0] == 0.0 and wilson_interval(400, 400)[1] == 1.0
    # The textbook value for 8 of 10 (Wilson 1927): [0.490, 0.943].
    assert [round(v, 3) for v in wilson_interval(8, 10)] == [0.49, 0.943]
    assert math.isclose(sum(wilson_interval(3, 7)) / 2, (3 + 1.96 ** 2 / 2) / (7 + 1.96 ** 2))


def test_the_table_shows_exact_and_per_token_accuracy_and_n_a_where_a_bin_could_not_run():
    report = {"task": {"name": "copy"},
              "results": [{"factor": 1.0, "exact": 1.0, "token_accuracy": 1.0},
                          {"factor": 2.0, "exact": None, "token_accuracy": None, "error": "learned"}]}
    table = task_table([report], ["learned"])
    assert "| copy | learned | 1.00 (1.00) | n/a |" in table


def _compose(name: str, overrides: list[str]) -> dict:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(Path(__file__).resolve().parents[2] / "configs"),
                                   version_base="1.3"):
            return OmegaConf.to_container(compose(name, overrides), resolve=True)
    finally:
        GlobalHydra.instance().clear()


def test_the_commands_configs_are_their_dataclasses(eval_schemas):
    evaluation = from_dict(TaskEvalConfig, _compose("eval_task", ["ckpt=runs/x", "factors=[1,2]"]),
                           owner="eval_task")
    assert evaluation == TaskEvalConfig(ckpt="runs/x", factors=[1, 2]) and evaluation.factors == (1.0, 2.0)
    lab = from_dict(TaskLabConfig, _compose("task_lab", ["encodings=[rope,fire]"]), owner="task_lab")
    assert lab.tasks == list(TASK_LAB_TASKS) and lab.encodings == ["rope", "fire"]
    assert lab.factors == list(DEFAULT_FACTORS) and lab.per_bin == 1000
    assert TaskLabConfig().encodings == list(TASK_LAB_ENCODINGS)


def test_task_lab_mistakes_are_one_line_errors():
    with pytest.raises(ValueError, match=r"task_lab.encodings='my_pos' is invalid: allowed: sinusoidal \| "):
        TaskLabConfig(encodings=["rope", "my_pos"])
    with pytest.raises(ValueError, match=r"task_lab.tasks='sort' is invalid: allowed: copy"):
        TaskLabConfig(tasks=["sort"])
    with pytest.raises(ValueError, match=r"task_lab.tasks='copy' is invalid: must be a non-empty list"):
        TaskLabConfig(tasks="copy")
    with pytest.raises(ValueError, match=r"task_lab.per_bin=0 is invalid"):
        TaskLabConfig(per_bin=0)
