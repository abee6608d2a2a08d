"""Issue #34: every script refuses a user's mistake in one ``error: <owner>.<key>=<value> is invalid: ...``
line, and checks the memory a small value implies before anything is allocated.

The scripts run in this process (``run_script``: their ``main`` with ``sys.argv`` set, exactly as
from a shell), so a traceback fails the test as the exception it is, and the machine's memory is
set by the test (``runtime.device.memory_bytes``), so a refusal does not depend on where it runs.
"""

from __future__ import annotations

import importlib
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from nanoattn import GPT, ModelConfig, runtime
from nanoattn.checkpoint import save_checkpoint
from nanoattn.config import DataConfig
from nanoattn.data import TokenData, ensure_prepared

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import _hydra_cli  # noqa: E402  (scripts/ is not a package)

GiB = 2**30


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """Run directories of tiny random models over one byte-tokenized corpus, and a task run."""
    root = tmp_path_factory.mktemp("runs")
    docs = root / "docs"
    docs.mkdir()
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    generator = torch.Generator().manual_seed(3)
    for i in range(8):
        picks = torch.randint(0, len(words), (300,), generator=generator).tolist()
        (docs / f"doc{i}.txt").write_text(" ".join(words[p] for p in picks) + "\n")
    data = DataConfig(name="tiny", corpus="text", paths=[str(docs)], root=str(root / "data"),
                      tokenizer={"type": "byte"}, val_fraction=0.2)
    data_dir = ensure_prepared(data)
    vocab = TokenData(data_dir).vocab_size
    found = {}
    for name, fields, task in (("rope", {}, None), ("learned", {"pos": "learned"}, None),
                               ("sinusoidal", {"pos": "sinusoidal"}, None),
                               ("diff", {"diff_attn": True, "n_head": 8, "n_kv_head": 4}, None),
                               ("task", {"max_seq_len": 128}, "copy")):
        torch.manual_seed(0)
        cfg = ModelConfig(**{**dict(vocab_size=vocab, d_model=32, n_layer=2, n_head=4, n_kv_head=2, d_ff=64,
                                    max_seq_len=32), **fields})
        run = root / name
        save_checkpoint(run / "checkpoints", "10", GPT(cfg), train_seq_len=32, step=10,
                        tokenizer_file=data_dir / "tokenizer.json")
        config = {"data": {"root": str(data_dir.parent), "name": data_dir.name}}
        if task is not None:
            config["task"] = {"name": task, "train_length": 8}
        (run / "config.yaml").write_text(json.dumps(config))  # JSON is YAML
        found[name] = run
    return found


def run_script(monkeypatch, name: str, *overrides: str) -> str | None:
    """``python scripts/<name>.py <overrides>``, run here; its error line (None when it succeeded)."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "scripts" / f"{name}.py"), *overrides])
    monkeypatch.setattr(_hydra_cli, "keep_freed_memory", lambda: False)  # the test process's malloc stays
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    GlobalHydra.instance().clear()
    try:
        importlib.import_module(name).main()
    except SystemExit as e:
        return str(e.code)
    finally:
        GlobalHydra.instance().clear()
    return None


def expect_one_line(message: str | None, pattern: str) -> None:
    assert message is not None and "\n" not in message, message
    assert re.match("error: " + pattern, message), message


TRACEBACKS = [  # (script, overrides, the refusal): each of these once ended in a traceback or named no key
    ("train", ['train.lr="0.001"'], r"train\.lr='0\.001' is invalid: must be a positive number$"),
    ("train", ["train.seed=99999999999999999999"],
     r"train\.seed=99999999999999999999 is invalid: must be an integer from 0 to 2\*\*63 - 1$"),
    ("sample", ["ckpt={rope}", "seed=99999999999999999999"], r"sample\.seed=99999999999999999999 is invalid"),
    ("eval_task", ["ckpt={task}", "seed=-1"], r"eval_task\.seed=-1 is invalid: must be an integer from 0"),
    ("eval_passkey", ["ckpt={rope}", "seed=18446744073709551616"],
     r"eval_passkey\.seed=18446744073709551616 is invalid"),
    ("eval_task", ["ckpt={task}", "factors=[1,inf]"],
     r"eval_task\.factors=\[1, inf\] is invalid: must be increasing positive finite numbers$"),
    ("task_lab", ["factors=[1,inf]"], r"task_lab\.factors=\[1, inf\] is invalid: must be increasing "),
    ("task_lab", ["variants=[fox,bogus]"], r"task_lab\.variants='bogus' is invalid: allowed: plain \| "),
    ("task_lab", ["variants=[nope]"], r"task_lab\.variants=\['nope'\] is invalid: must not repeat a row: "
                                      r"copy/nope twice$"),
    ("eval_length", ["ckpt={rope}", "multiples=[1,inf]"],
     r"eval_length\.multiples=\[1, inf\] is invalid: inf is not a positive finite number$"),
    ("eval_passkey", ["ckpt={rope}", "multiples=[1,nan]"],
     r"eval_passkey\.multiples=\[1, nan\] is invalid: nan "),
    ("eval_length", ["ckpt={rope}", "multiples=[1,1e300]"],
     r"eval_length\.multiples=\[1, 1e\+300\] is invalid: a forward pass over 4 x [\d,]+ tokens needs "),
    ("eval_passkey", ["ckpt={rope}", "multiples=[1,1e300]"],
     r"eval_passkey\.multiples=\[1, 1e\+300\] is invalid"),
    ("eval_length", ["ckpt={rope}", "multiples=[1,1e307]"],
     r"eval_length\.multiples=\[1, 1e\+307\] is invalid: x the training length 32 is past any length$"),
    ("analyze_heads", ["ckpt={diff}", "head=[1,4]"],
     r"analyze_heads\.head=\[1, 4\] is invalid: expected \[layer, head\] with 0 <= layer < 2 and "
     r"0 <= head < 4 \(differential attention: pairs of its 8 query heads\)$"),
    ("compare_length", ["paths=[{task}/task_eval.json]"], r".*task_eval\.json is not a length evaluation"),
    ("eval_length", ["ckpt={learned}", "mode=streaming"],
     r"eval_length\.mode='streaming' is invalid: needs positions inside attention, which the cache can move; "
     r"pos='learned' adds them to the embeddings"),
    ("eval_length", ["ckpt={sinusoidal}", "mode=streaming"], r"eval_length\.mode='streaming' is invalid: "),
    ("train", ["experiment=tasks", "task=copy", "recipe=adamw_baseline"],
     r"recipe=adamw_baseline is invalid with experiment=tasks: the experiment sets train\.optimizer='muon' "
     r"\(the recipe: 'adamw'\); set each on the command line to choose, or drop recipe="),
    # sample's and export_hf's other command-line mistakes: tests/test_sample_cli.py and tests/test_hf.py
    # start one real process each for a mistake (its one line, no traceback), so these need no process.
    ("sample", [], r"sample\.ckpt=None is invalid"),
    ("sample", ["ckpt={rope}/nothing"], r".*does not exist"),
    # dotted rope_scaling keys need no '+': the scaling reaches the model's validation
    ("sample", ["ckpt={rope}/checkpoints/10", "rope_scaling.type=bogus", "rope_scaling.factor=4"],
     r".*type='bogus' is invalid"),
    ("export_hf", ["ckpt={rope}"], r"export_hf\.out=None is invalid"),
    ("export_hf", ["out=hf"], r"export_hf\.ckpt=None is invalid"),
]


@pytest.mark.parametrize(("script", "overrides", "refusal"), TRACEBACKS,
                         ids=[f"{s}-{'-'.join(o)[-40:]}" for s, o, _ in TRACEBACKS])
def test_each_mistake_is_one_line_naming_its_key(runs, tmp_path, monkeypatch, capsys, script, overrides,
                                                 refusal):
    if any("task_eval.json" in arg for arg in overrides):  # another kind of report than compare_length reads
        (runs["task"] / "task_eval.json").write_text(json.dumps(
            {"checkpoint": "x", "results": [{"factor": 1.0, "exact": 0.5}]}))
    monkeypatch.chdir(tmp_path)  # a training run's directory, never the checkout
    args = [arg.format(**runs) for arg in overrides]
    expect_one_line(run_script(monkeypatch, script, *args, *(["logger=none"] if script == "train" else [])),
                    refusal)
    assert capsys.readouterr().out == ""  # the refusal alone, on stderr


@pytest.mark.parametrize("content", ["- a list\n", "data: [unclosed\n", "{section}: 3\n"])
@pytest.mark.parametrize(("script", "section"), [("eval_length", "data"), ("eval_task", "task")])
def test_a_malformed_run_config_yaml_is_one_line_naming_the_file(runs, monkeypatch, tmp_path, content, script,
                                                                 section):
    run = tmp_path / "run"
    shutil.copytree(runs["task"] / "checkpoints", run / "checkpoints")
    (run / "config.yaml").write_text(content.format(section=section))
    message = run_script(monkeypatch, script, f"ckpt={run}", "plot=false")
    file = re.escape(str(run / "config.yaml"))
    expect_one_line(message, rf"{file}( is unreadable: | is not a run config \(a YAML mapping of sections\)$"
                             rf"|: {section}=3 is invalid: must be a mapping of its keys$)")


# ------------------------------------------------------------------------------------------ memory

MEMORY = [  # (script, overrides, the refusal), on a machine of 4 GiB
    ("train", ["experiment=tasks", "task=copy", "task.train_length=100000000", "pos=rope"],
     r"task\.train_length=100000000 is invalid: a training step over 32 x 200,000,002 tokens needs at least "
     r"[\d,.]+ GiB, more than the 4\.0 GiB of cpu$"),
    ("train", ["train.batch_size=10000000"], r"train\.batch_size=10000000 is invalid: a training step over "),
    ("train", ["model.n_layer=100000000"],
     r"model\.n_layer=100000000 is invalid: a model of n_layer=100,000,000"),
    ("eval_task", ["ckpt={task}", "per_bin=1000000000"],
     r"eval_task\.per_bin=1000000000 is invalid: keeping 5 bins x 1,000,000,000 instance records needs "),
    ("eval_task", ["ckpt={task}", "factors=[1,100000000]"],
     r"eval_task\.factors=\[1\.0, 100000000\.0\] is invalid: a batch of 64 copy rows of 1,600,000,002 tokens "
     r"\(sizes up to 800,000,000\) needs at least"),
    ("task_lab", ["factors=[1,100000000]"],
     r"task_lab\.factors=\[1\.0, 100000000\.0\] is invalid: a batch of 64 "),
    ("analyze_heads", ["ckpt={rope}", "batch_size=10000000"],
     r"analyze_heads\.batch_size=10000000 is invalid: 80,000,000 windows of 32 tokens and a batch's "
     r"attention weights \(2 layers x 4 heads\) needs at least"),
    ("analyze_heads", ["ckpt={rope}", "seq_len=100000"], r"analyze_heads\.seq_len=100000 is invalid: "),
    ("analyze_heads", ["ckpt={rope}", "map_len=100000", "n_batches=1"],
     r"analyze_heads\.map_len=100000 is invalid: attention maps of [\d,]+ tokens \(2 layers x 4 heads\) "),
    ("bench", ["batch_size=100000", "seq_len=100000", "only=[train]"],
     r"bench\.batch_size=100000 is invalid: a training step over 100,000 x 100,000 tokens needs at least"),
    ("eval_length", ["ckpt={rope}", "lengths=[32,100000000]"], r"eval_length\.lengths=\[32, 100000000\] is "),
    ("sample", ["ckpt={rope}", "prompt_file=/dev/zero"],
     r"sample\.prompt_file='/dev/zero' is invalid: is longer than 16,777,216 bytes, more than the memory "
     r"of this machine can tokenize"),
]


@pytest.mark.parametrize(("script", "overrides", "refusal"), MEMORY,
                         ids=[f"{s}-{'-'.join(o)[-40:]}" for s, o, _ in MEMORY])
def test_what_a_small_value_implies_is_checked_before_allocating(runs, tmp_path, monkeypatch, script,
                                                                  overrides, refusal):
    monkeypatch.setattr(runtime.device, "memory_bytes", lambda device: 4 * GiB)
    if script == "analyze_heads" and "map_len" in overrides[1]:
        # The maps are of the tokens drawn: this run's held-out split, 500-odd of them, at 1 MiB of memory.
        monkeypatch.setattr(runtime.device, "memory_bytes", lambda device: 2**20)
    monkeypatch.chdir(tmp_path)
    args = [arg.format(**runs) for arg in overrides]
    extra = {"train": [f"out_dir={tmp_path / 'run'}", "logger=none"], "task_lab": [f"runs_root={tmp_path}"],
             "analyze_heads": [f"out_dir={tmp_path / 'heads'}"]}.get(script, [])
    expect_one_line(run_script(monkeypatch, script, *args, *extra), refusal)
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]  # nothing was written


def test_a_differential_models_heads_are_its_pairs_in_every_label(runs, tmp_path, monkeypatch, capsys):
    """head=[1, 0] once indexed past the records (n_head per layer, not its n_head / 2 pairs), and on
    larger models labelled another layer's head."""
    titles = []
    module = importlib.import_module("nanoattn.commands.analyze_heads")
    monkeypatch.setattr(module, "plot_attention_head", lambda maps, path, title, tokens: titles.append(title))
    for head in ([1, 0], [1, 3]):
        assert run_script(monkeypatch, "analyze_heads", f"ckpt={runs['diff']}", f"head={head}",
                          f"out_dir={tmp_path}", "n_batches=1", "batch_size=2", "prune_steps=2") is None
    report = json.loads((tmp_path / "heads.json").read_text())
    kinds = {(r["layer"], r["head"]): r["kind"] for r in report["heads"]}
    assert sorted(kinds) == [(layer, head) for layer in range(2) for head in range(4)]
    assert titles == [f"layer 1 head 0 ({kinds[1, 0]})", f"layer 1 head 3 ({kinds[1, 3]})"]
    assert "2 layers x 4 differential heads (pairs of its 8 query heads; 4 kv)" in capsys.readouterr().out
