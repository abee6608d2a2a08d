"""Comparing length evaluations: the markdown table, labels, the figure, table markers, the command,
the extrapolation lab's driver and their scripts."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_one_line_errors import expect_one_line, run_script

from nanoattn.commands.compare_length import CompareLengthConfig, compare_length
from nanoattn.commands.labs import AttentionLabConfig, LabConfig
from nanoattn.eval import format_table, length_table, load_report, write_table
from nanoattn.eval.compare import length_table_caption
from nanoattn.validation import from_dict

REPO = Path(__file__).resolve().parents[2]


def report(train_seq_len: int, ppls: dict[int, float | None]) -> dict:
    results = []
    for length, ppl in ppls.items():
        if ppl is None:
            results.append({"length": length, "stride": length, "loss": None, "ppl": None, "tokens": 0,
                            "error": "sequence length past the learned position table"})
        else:
            results.append({"length": length, "stride": length, "loss": 1.0, "ppl": ppl, "tokens": 100})
    return {"train_seq_len": train_seq_len, "mode": "chunks", "results": results,
            "per_position_length": max(n for n, p in ppls.items() if p is not None),
            "per_position_loss": [2.0, 1.5, 1.25, 1.0]}


@pytest.fixture
def two_runs(tmp_path) -> list[Path]:
    (tmp_path / "alibi").mkdir()
    (tmp_path / "learned").mkdir()
    (tmp_path / "rope").mkdir()
    files = [tmp_path / "alibi" / "length_eval.json", tmp_path / "learned" / "length_eval.json",
             tmp_path / "rope" / "length_eval_yarn4.json"]
    files[0].write_text(json.dumps(report(128, {128: 10.0, 256: 10.5, 512: 11.0})))
    files[1].write_text(json.dumps(report(128, {128: 12.0, 256: None})))
    files[2].write_text(json.dumps(report(128, {128: 9.0, 512: 36.0})))
    return files


def test_the_table_from_result_files(two_runs):
    loaded = [load_report(two_runs[0].parent), load_report(two_runs[1]), load_report(two_runs[2])]
    assert [label for label, _ in loaded] == ["alibi", "learned", "rope/yarn4"]
    table = length_table([r for _, r in loaded], [label for label, _ in loaded])
    assert table.splitlines() == [
        "| run | 128 (1×) | 256 (2×) | 512 (4×) |",
        "|---|---:|---:|---:|",
        "| alibi | 10.0 (1.00×) | 10.5 (1.05×) | 11.0 (1.10×) |",
        "| learned | 12.0 (1.00×) | n/a |  |",
        "| rope/yarn4 | 9.0 (1.00×) |  | 36.0 (4.00×) |",
    ]


def test_mixed_training_lengths_head_columns_by_length_only():
    table = length_table([report(128, {128: 8.0}), report(256, {128: 7.0, 256: 7.5})], ["a", "b"])
    assert table.splitlines()[0] == "| run | 128 | 256 |"
    assert table.splitlines()[2:] == ["| a | 8.0 (1.00×) |  |", "| b | 7.0 (0.93×) | 7.5 (1.00×) |"]


def test_ratios_to_a_named_baseline_are_at_the_same_length(two_runs, tmp_path):
    base = {128: 8.0, 256: 10.0}
    table = length_table([report(128, base), report(128, {128: 6.0, 256: 5.0})], ["rope", "alibi"], "rope")
    assert table.splitlines()[2:] == ["| rope | 8.0 (1.00×) | 10.0 (1.00×) |",
                                      "| alibi | 6.0 (0.75×) | 5.0 (0.50×) |"]
    paths = [str(p) for p in two_runs[:2]]
    with pytest.raises(ValueError, match=r"^compare_length.baseline='yarn' is invalid: must be one of the "
                                         r"labels: "):
        compare_length(CompareLengthConfig(paths=paths, out=str(tmp_path / "c.png"), baseline="yarn"))
    assert not (tmp_path / "c.png").exists()


def test_compare_writes_the_figure_and_the_table(two_runs, tmp_path, capsys):
    paths = [str(p) for p in two_runs]
    table = compare_length(CompareLengthConfig(paths=paths[:2], out=str(tmp_path / "cmp.png"),
                                               table=str(tmp_path / "cmp.md")))
    assert (tmp_path / "cmp.png").stat().st_size > 10_000
    assert (tmp_path / "cmp.md").read_text() == table and "| learned | 12.0 (1.00×) | n/a |" in table
    written = f"wrote {tmp_path / 'cmp.png'} and {tmp_path / 'cmp.md'}\n"
    assert capsys.readouterr().out == length_table_caption() + table + written
    with pytest.raises(ValueError, match=re.escape("compare_length.labels=['x'] is invalid: must be a list "
                                                   "of one label per path (3)")):
        CompareLengthConfig(paths=paths, labels=["x"])
    with pytest.raises(ValueError, match="compare_length.paths=None is invalid: required"):
        CompareLengthConfig()
    with pytest.raises(ValueError, match="neither a length_eval JSON file nor a run directory"):
        compare_length(CompareLengthConfig(paths=[str(tmp_path)], out=str(tmp_path / "x.png")))



def test_compare_replaces_only_its_own_figure_and_table(two_runs, tmp_path, capsys):
    """table= and out= never overwrite a run's metrics.jsonl, or any file that is not an earlier table
    or figure; a second comparison replaces the first's."""
    metrics = two_runs[0].parent / "metrics.jsonl"
    metrics.write_text('{"step": 1, "train_loss": 2.0}\n')
    (tmp_path / "photo.png").write_bytes(b"\x89PNG someone's photo")
    paths = [str(p) for p in two_runs]
    for key, value, what in (("table", str(metrics), "a length table"), ("out", str(metrics), "a figure"),
                             ("out", str(tmp_path / "photo.png"), "a figure")):
        fields = {"out": str(tmp_path / "cmp.png"), key: value}
        with pytest.raises(ValueError, match=re.escape(f"compare_length.{key}: {value} exists and is not "
                                                       f"{what}: never overwritten; choose another {key}")):
            compare_length(CompareLengthConfig(paths=paths, **fields))
    assert metrics.read_text() == '{"step": 1, "train_loss": 2.0}\n'
    assert (tmp_path / "photo.png").read_bytes() == b"\x89PNG someone's photo"
    assert not (tmp_path / "cmp.png").exists()  # refused before drawing anything
    figure, table = str(tmp_path / "cmp.png"), str(tmp_path / "t.md")
    with pytest.raises(ValueError, match=r"^compare_length.table='.*cmp.png' is invalid: must be another"):
        CompareLengthConfig(paths=paths, out=figure, table=figure)
    for _ in range(2):  # the second replaces the first's figure and table
        compare_length(CompareLengthConfig(paths=paths, out=figure, table=table))
    assert (tmp_path / "t.md").read_text().startswith("| run |")

def test_format_table_aligns_columns_and_refuses_a_bad_alignment():
    table = format_table(["a", "b", "c"], [["x", "1", ""]], align="lrl")
    assert table == "| a | b | c |\n|---|---:|---|\n| x | 1 |  |\n"
    with pytest.raises(ValueError, match="align='lr' is invalid"):
        format_table(["a", "b", "c"], [], align="lr")


def test_the_table_replaces_only_its_marked_block(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# Title\n\nprose before\n")
    write_table(doc, "| a |\n", name="extrapolation-table")
    write_table(doc, "| b |\n", name="passkey-table")
    # A rerun replaces the first block, keeps the prose and the other block.
    write_table(doc, "| c |\n", name="extrapolation-table")
    assert doc.read_text() == ("# Title\n\nprose before\n\n"
                               "<!-- extrapolation-table:begin -->\n| c |\n"
                               "<!-- extrapolation-table:end -->\n\n"
                               "<!-- passkey-table:begin -->\n| b |\n<!-- passkey-table:end -->\n")


def test_the_script(two_runs, tmp_path, monkeypatch):
    args = [f"paths=[{','.join(map(str, two_runs))}]", f"out={tmp_path / 'c.png'}", "labels=[A,L,R]"]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "compare_length.py"), *args],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| R | 9.0 (1.00×) |  | 36.0 (4.00×) |" in done.stdout and (tmp_path / "c.png").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alibi", "c.png", "learned", "rope"]  # no Hydra
    expect_one_line(run_script(monkeypatch, "compare_length", f"paths=[{tmp_path / 'missing.json'}]"),
                    r"'.*missing\.json' is neither a length_eval JSON file nor a run directory")


def test_lab_config_mistakes_are_one_line_errors(tmp_path):
    with pytest.raises(ValueError, match=re.escape("extrapolation_lab.passkey='yes' is invalid: must be")):
        from_dict(LabConfig, {"passkey": "yes"}, owner="extrapolation_lab")
    with pytest.raises(ValueError, match=re.escape("extrapolation_lab.samples=0 is invalid")):
        LabConfig(samples=0)
    with pytest.raises(ValueError, match=re.escape("extrapolation_lab.dtype='fp8' is invalid: allowed:")):
        LabConfig(dtype="fp8")
    with pytest.raises(ValueError, match=re.escape("lab.seeds=[0, 0] is invalid: must not repeat")):
        LabConfig(seeds=[0, 0])
    with pytest.raises(ValueError, match=re.escape("extrapolation_lab.seeds=-1 is invalid")):
        LabConfig(seeds=[-1])
    with pytest.raises(ValueError, match=re.escape("lab.seeds='0' is invalid: must be a non-empty")):
        LabConfig(seeds="0")
    # The attention lab shares the run keys and their checks, under its own name.
    with pytest.raises(ValueError, match=re.escape("attention_lab.workers=0 is invalid")):
        AttentionLabConfig(workers=0)
    with pytest.raises(ValueError, match=re.escape("unknown key(s) attention_lab.passkey; allowed:")):
        from_dict(AttentionLabConfig, {"passkey": True}, owner="attention_lab")
