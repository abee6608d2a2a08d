"""configs/data/*.yaml compose into valid DataConfigs; the prepare script fails in one line."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from nanoattn.config import DataConfig, TokenizerConfig
from nanoattn.data import prepare as prepare_module

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
import prepare_data  # noqa: E402, F401  (registers prepare_data_schema; scripts/ is not a package)

PRESETS = sorted(p.stem for p in (REPO / "configs" / "data").glob("*.yaml"))


def _compose(overrides: list[str]):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        return compose(config_name="prepare_data", overrides=overrides)


def test_every_preset_is_there():
    assert PRESETS == ["hf", "rows", "shakespeare", "shakespeare_byte", "shakespeare_char", "text"]


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_composes_into_a_valid_data_config(name):
    required = {"text": ["data.paths=[notes.txt]"], "rows": ["data.paths=[web/]"],
                "hf": ["data.hf_name=user/corpus"]}.get(name, [])
    cfg = _compose([f"data={name}", *required])
    data = DataConfig.from_dict(OmegaConf.to_container(cfg.data, resolve=True))
    assert data.name == name and cfg.force is False


def test_default_and_char_presets_match_the_documented_configs():
    assert DataConfig.from_dict(OmegaConf.to_container(_compose([]).data)) == DataConfig()
    char = DataConfig.from_dict(OmegaConf.to_container(_compose(["data=shakespeare_char"]).data))
    assert char == DataConfig(name="shakespeare_char", corpus="shakespeare",
                              tokenizer=TokenizerConfig(type="char"))
    byte = DataConfig.from_dict(OmegaConf.to_container(_compose(["data=shakespeare_byte"]).data))
    assert byte == DataConfig(name="shakespeare_byte", corpus="shakespeare",
                              tokenizer=TokenizerConfig(type="byte"))


def test_the_script_reports_bad_input_in_one_line(tmp_path):
    missing = tmp_path / "missing.txt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "prepare_data.py"), "data=text",
                           f"data.paths=['{missing}']", f"data.root={tmp_path}"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert done.returncode == 1
    assert done.stderr.strip() == f"error: data.paths: {missing}: no such file or folder"
    assert list(tmp_path.iterdir()) == []  # neither Hydra nor the script wrote anything


def test_ctrl_c_while_preparing_is_one_line_and_leaves_only_the_resumable_folder(tmp_path, monkeypatch):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("some text to prepare\n" * 50)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt  # what Ctrl-C raises, here in the middle of writing the tokens

    monkeypatch.setattr(prepare_module, "write_split", interrupted)
    monkeypatch.setattr(sys, "argv", ["prepare_data.py", "data=text", f"data.paths=[{corpus}]",
                                      f"data.root={tmp_path / 'data'}", "data.tokenizer.type=byte"])
    with pytest.raises(SystemExit, match="^error: interrupted$"):
        runpy.run_path(str(REPO / "scripts" / "prepare_data.py"), run_name="__main__")
    left = list((tmp_path / "data").iterdir())  # no target, no lock file: what the next run resumes
    assert [p.name.split("-")[0] for p in left] == [".text.partial"]
