"""The multiple-choice scorer (nanoattn/eval/choice.py) and lm-eval's --model nanoattn
(nanoattn/commands/harness.py, scripts/eval_harness.py): lm-eval's command line scores a local task
as the project's scorer does."""

from __future__ import annotations

import functools
import json
import runpy
import sys
from pathlib import Path
from types import SimpleNamespace

import lm_eval.tasks
import pytest
import torch

from nanoattn import GPT, ModelConfig
from nanoattn.checkpoint import save_checkpoint
from nanoattn.commands.harness import NanoattnLM
from nanoattn.data import TokenData
from nanoattn.eval.choice import ChoiceItem, continuation_logprobs, score_choices, with_start

REPO = Path(__file__).resolve().parents[2]
ITEMS = [ChoiceItem("to be or", ("not to be", "the question", "nobler tis"), 0),
         ChoiceItem("that is the", ("question", "be", "whether or not"), 0),
         ChoiceItem("", ("to be", "tis nobler in the mind"), 1),
         ChoiceItem("whether tis nobler", ("in", "to be or not to be that is"), 1),
         ChoiceItem("the question is", ("that", "not", "whether", "or"), 2)]


@pytest.fixture(scope="module")
def run(prepared, tmp_path_factory) -> Path:
    """A tiny untrained model's run directory over the byte corpus: its scores are arbitrary, and
    the same whoever computes them."""
    run_dir = tmp_path_factory.mktemp("harness_run")
    data = TokenData(prepared)
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=data.vocab_size, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64,
                            max_seq_len=32, pos="rope", init_std=0.2))
    save_checkpoint(run_dir / "checkpoints", "10", model, train_seq_len=32, step=10,
                    tokenizer_file=prepared / "tokenizer.json")
    (run_dir / "config.yaml").write_text(f"data:\n  root: {prepared.parent}\n  name: {prepared.name}\n")
    return run_dir


def requests(*args: tuple) -> list[SimpleNamespace]:
    return [SimpleNamespace(args=a) for a in args]


def test_a_continuations_log_likelihood_is_its_tokens_and_holds_in_any_batch(run):
    lm = NanoattnLM(ckpt=str(run), batch_size=1)
    pairs = [(with_start(lm.data, "to be"), lm.data.tokenizer.encode(" or not").ids),
             (with_start(lm.data, ""), lm.data.tokenizer.encode("question").ids),
             (with_start(lm.data, "x" * 40), lm.data.tokenizer.encode(" nobler").ids)]  # past max_seq_len
    one = continuation_logprobs(lm.model, pairs, batch_size=1)
    for (context, continuation), (logprob, greedy) in zip(pairs, one, strict=True):
        tokens = torch.tensor([*context, *continuation][-33:])
        with torch.no_grad():
            logits = lm.model(tokens[None, :-1]).float()[0, -len(continuation):]
        target = torch.tensor(continuation)
        by_hand = logits.log_softmax(-1).gather(-1, target[:, None]).sum().item()
        assert logprob == pytest.approx(by_hand, abs=1e-5)
        assert greedy == bool((logits.argmax(-1) == target).all())
    # Padded beside longer rows, the same numbers (float32: the same sums, another batch shape).
    batched = continuation_logprobs(lm.model, pairs, batch_size=3)
    assert [g for _, g in batched] == [g for _, g in one]
    assert [lp for lp, _ in batched] == pytest.approx([lp for lp, _ in one], abs=1e-5)
    # A greedy continuation: what the model writes after "to be" is greedy by definition.
    written = lm.generate_until(requests(("to be", {"max_gen_toks": 3, "until": []})))[0]
    assert lm.loglikelihood(requests(("to be", written)))[0][1]


def test_the_rolling_likelihood_predicts_every_token_once_in_windows(run):
    lm = NanoattnLM(ckpt=str(run))
    text = "to be or not to be that is the question whether tis nobler in the mind"  # 71 tokens, 3 windows
    ids = lm.data.tokenizer.encode(text).ids
    total = lm.loglikelihood_rolling(requests((text,)))[0]
    # Window by window by hand: 32 tokens predicted from the start token, then each later 32 with the
    # longest context that fits, the last overlapping the one before.
    expected, predicted = 0.0, 0
    while predicted < len(ids):
        stop = min(predicted + 32, len(ids))
        window = [lm.eot, *ids][max(0, stop - 32):stop + 1]
        with torch.no_grad():
            logprobs = lm.model(torch.tensor(window[:-1])[None]).float().log_softmax(-1)[0]
        new = stop - predicted
        expected += logprobs[-new:].gather(-1, torch.tensor(window[-new:])[:, None]).sum().item()
        predicted = stop
    assert total == pytest.approx(expected, abs=1e-4)


def test_generation_stops_at_the_first_until_string_and_bad_model_args_are_refused(run):
    lm = NanoattnLM(ckpt=str(run))
    free = lm.generate_until(requests(("to be", {"max_gen_toks": 12, "until": []})))[0]
    assert len(lm.data.tokenizer.encode(free).ids) <= 12
    stop = free[3:5]
    cut = lm.generate_until(requests(("to be", {"max_gen_toks": 12, "until": [stop, "\u2603"]})))[0]
    assert cut == free[:free.index(stop)]
    with pytest.raises(ValueError, match=r"^--model_args temperature are invalid for --model nanoattn: "
                                         r"allowed: ckpt, device$"):
        NanoattnLM(ckpt=str(run), temperature=1)
    with pytest.raises(ValueError, match="gold=3 is invalid: must index one of its 2 choices"):
        ChoiceItem("x", ("a", "b"), 3)


TASK = """task: nanoattn_choices
dataset_path: json
dataset_kwargs:
  data_files:
    test: {items}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: gold
metric_list:
  - metric: acc
  - metric: acc_norm
"""


def test_lm_evals_command_line_scores_a_local_task_as_the_projects_scorer(run, tmp_path, monkeypatch):
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    items = tmp_path / "items.jsonl"
    items.write_text("".join(json.dumps({"context": item.context, "choices": list(item.choices),
                                         "gold": item.gold}) + "\n" for item in ITEMS))
    (tasks / "nanoattn_choices.yaml").write_text(TASK.format(items=items))
    # lm-eval's command line run in-process: the script as python runs it, its arguments in sys.argv. Its
    # task index reads only the local task, not the thousands of YAML files lm-eval ships (its command
    # line reads them all at every start: tens of seconds, for tasks this test never runs).
    monkeypatch.setattr(lm_eval.tasks, "TaskManager",
                        functools.partial(lm_eval.tasks.TaskManager, include_defaults=False))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["eval_harness.py", "--model", "nanoattn", "--model_args", f"ckpt={run}",
                                      "--device", "cpu", "--tasks", "nanoattn_choices", "--include_path",
                                      str(tasks), "--batch_size", "4", "--output_path",
                                      str(tmp_path / "out")])
    runpy.run_path(str(REPO / "scripts" / "eval_harness.py"), run_name="__main__")
    (results,) = (tmp_path / "out").rglob("results_*.json")
    measured = json.loads(results.read_text())["results"]["nanoattn_choices"]
    lm = NanoattnLM(ckpt=str(run))
    ours = score_choices(lm.model, lm.data, ITEMS)
    assert ours["items"] == len(ITEMS)
    assert (measured["acc,none"], measured["acc_norm,none"]) == (ours["acc"], ours["acc_norm"])
    # Both metrics are decided by the items, not constant: the norm moves some answers here.
    assert 0 < ours["acc"] < 1 or 0 < ours["acc_norm"] < 1
