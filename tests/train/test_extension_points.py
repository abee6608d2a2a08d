"""One registry per extension point: a new encoding, attention variant or task is one definition plus
one registry line, and every place that offers the choices takes it up with no other file touched:
its Hydra option, training, exact cached decoding, the labs' plans and the bench's rows."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf

from nanoattn import GPT, ModelConfig, generate
from nanoattn.bench.variants import bench_attention
from nanoattn.commands.labs import LABS, AttentionLabConfig, LabConfig, TaskLabConfig
from nanoattn.config import RunConfig
from nanoattn.config.options import ATTENTION_VARIANTS, encoding_options
from nanoattn.generate import Decoding
from nanoattn.logging import read_metrics
from nanoattn.positional import REGISTRY, PositionalEncoding
from nanoattn.tasks import TASKS, Instance, Segment, Task
from nanoattn.train import train

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
from _hydra_cli import register_options, register_schema  # noqa: E402  (scripts/ is not a package)


class DistancePenalty(PositionalEncoding):
    """A user's encoding: minus the distance between query and key, one slope for every head."""

    adds_bias = True

    def __init__(self, cfg, layers) -> None:
        super().__init__(cfg, layers)
        self.n_head = cfg.n_head

    def bias(self, q, k, q_positions, k_positions, layer):
        distance = (q_positions[:, None] - k_positions[None, :]).abs().float()  # [Tq, Tk]
        return (-0.25 * distance).expand(self.n_head, -1, -1)  # [n_head, Tq, Tk]


class Echo(Task):
    """A user's task: ``abc=`` answered by ``abc``."""

    name = "echo"
    alphabet = "xyz="

    def instance(self, rng: np.random.Generator, size: int, filler: np.ndarray | None = None) -> Instance:
        text = "".join(rng.choice(list("xyz"), size))
        return Instance(size, (Segment(text + "="), Segment(text, scored=True)))

    def max_tokens(self, size: int) -> int:
        return 2 * size + 1


@pytest.fixture
def registered(monkeypatch):
    """The three registry lines, for this test only (Hydra's store forgets their options after it)."""
    monkeypatch.setitem(REGISTRY, "distance_penalty", DistancePenalty)
    monkeypatch.setitem(ATTENTION_VARIANTS, "capped_window", dict(sliding_window=6, attn_softcap=5.0))
    monkeypatch.setitem(TASKS, "echo", Echo)
    register_schema("train_schema", RunConfig)
    register_options()
    yield
    store = ConfigStore.instance().repo
    for group, name in (("pos", "distance_penalty"), ("attention", "capped_window"), ("task", "echo")):
        del store[group][f"{name}.yaml"]


def composed(overrides: list[str]) -> RunConfig:
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
            cfg = compose(config_name="train", overrides=overrides)
    finally:
        GlobalHydra.instance().clear()
    return RunConfig.from_dict(OmegaConf.to_container(cfg, resolve=True))


def decodes_exactly(cfg: ModelConfig) -> None:
    """Cached greedy decoding past the training length equals recomputing every step."""
    torch.manual_seed(0)
    model = GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 5), generator=torch.Generator().manual_seed(1))
    n = 2 * cfg.max_seq_len
    assert torch.equal(generate(model, idx, n, temperature=0), generate(model, idx, n, temperature=0,
                                                                        use_cache=False))
    decoding = Decoding(model, idx, n, temperature=0)
    for step, _ in enumerate(decoding):
        with torch.no_grad():
            recomputed = model(decoding.idx[:, :5 + step])[:, -1]  # [B, V]
        torch.testing.assert_close(decoding.last_logits, recomputed, atol=1e-5, rtol=1e-5)


def trains(tmp_path: Path, tiny_config, **model) -> None:
    run = train(tiny_config(tmp_path, model=model, max_steps=4, eval_interval=0, ckpt_interval=0))
    losses = [r["train_loss"] for r in read_metrics(run / "metrics.jsonl") if "train_loss" in r]
    assert len(losses) == 4 and all(np.isfinite(losses))


def test_a_new_encoding_is_an_option_trains_decodes_and_is_a_lab_row(registered, tmp_path, tiny_config):
    assert composed(["pos=distance_penalty"]).model.pos == "distance_penalty"
    trains(tmp_path / "run", tiny_config, pos="distance_penalty")
    decodes_exactly(ModelConfig(vocab_size=32, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=8,
                                pos="distance_penalty"))
    assert "distance_penalty" in [row.label for row in LABS["extrapolation"].rows(LabConfig())]
    assert "distance_penalty" in [row.label for row in LABS["passkey"].rows(LabConfig(passkey=True))]
    assert TaskLabConfig(encodings=["distance_penalty"]).encodings == ["distance_penalty"]
    assert "distance_penalty" in encoding_options()  # the bench's encodings rows


def test_a_new_attention_variant_is_an_option_trains_decodes_and_is_a_lab_row(registered, tmp_path,
                                                                              tiny_config):
    model = composed(["experiment=attention", "attention=capped_window"]).model
    assert (model.sliding_window, model.attn_softcap) == (6, 5.0)
    trains(tmp_path / "run", tiny_config, sliding_window=6, attn_softcap=5.0)
    decodes_exactly(ModelConfig(vocab_size=32, d_model=32, n_layer=2, n_head=4, n_kv_head=2, max_seq_len=8,
                                **ATTENTION_VARIANTS["capped_window"]))
    assert "capped_window" in [row.label for row in LABS["attention"].rows(AttentionLabConfig())]
    assert "capped_window" in bench_attention()


def test_a_new_task_is_an_option_trains_and_is_a_task_lab_row(registered, tmp_path, tiny_config):
    run = composed(["experiment=tasks", "task=echo", "pos=nope"])
    assert run.task.name == "echo" and run.task.train_length == Echo.train_length
    cfg = tiny_config(tmp_path / "run", model={"vocab_size": 257, "max_seq_len": 40}, max_steps=4,
                      eval_interval=0, ckpt_interval=0)
    done = train({**cfg, "task": {"name": "echo", "train_length": 8}})
    assert [r["step"] for r in read_metrics(done / "metrics.jsonl")][-1] == 4
    lab = TaskLabConfig(tasks=["echo"], encodings=["nope"], variants=[])
    assert [row.label for row in LABS["tasks"].rows(lab)] == ["echo/nope"]
