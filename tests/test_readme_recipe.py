"""The README's encoding recipe as written: its file, its import line and its registry line make an
encoding that configs accept and that the generic checks pass (cached decoding equal to recomputation,
the chunked bias equal to the explicit path). Pasted into a clone, it passes the whole suite: the
checks of hand-written pages report it as not yet covered (tests/coverage.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import torch
from test_generate import check_cached_decoding, tiny

from nanoattn import ModelConfig
from nanoattn.model import routes
from nanoattn.model.attention import Attention
from nanoattn.positional import REGISTRY, build_positional

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def recipe() -> tuple[str, str, str, str, str]:
    """(the file's path, its code, its import line, the registry name, the class it names)."""
    block = re.search(r"```python\n# (nanoattn/positional/\w+\.py)\n(.*?)```", README, re.DOTALL)
    path, code = block.groups()
    sentence = README.split(code + "```\n\n", 1)[1].split("\n\n", 1)[0].replace("\n", " ")
    import_line = re.search(r"its import, `(from [\w.]+ import \w+)`", sentence).group(1)
    name, cls = re.search(r'its `REGISTRY` line, `"(\w+)": (\w+),`', sentence).groups()
    return path, code, import_line, name, cls


@pytest.fixture
def registered(tmp_path, monkeypatch) -> str:
    """The recipe's encoding, its file imported as the module its import line names and registered as its
    registry line says, for this test only; its registry name."""
    path, code, import_line, name, cls = recipe()
    module_name = path.removesuffix(".py").replace("/", ".")
    assert import_line == f"from {module_name} import {cls}"  # the import names the file the recipe wrote
    file = tmp_path / Path(path).name
    file.write_text(code)
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, module_name, module)
    spec.loader.exec_module(module)
    scope: dict = {}
    exec(import_line, scope)  # the README's line, as a user's __init__.py would run it
    monkeypatch.setitem(REGISTRY, name, scope[cls])
    return name


def test_the_recipes_encoding_is_a_config_choice_with_a_bias_of_its_paper(registered):
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, pos=registered)
    pe = build_positional(cfg)
    positions = torch.arange(6)
    bias = pe.bias(None, None, positions, positions, 0)  # [n_head, Tq, Tk]
    distance = (positions[:, None] - positions[None, :]).float()
    torch.testing.assert_close(bias, -0.1 * distance.expand(4, 6, 6), rtol=0, atol=0)
    with pytest.raises(ValueError, match=rf"pos='{registered}x'.*{registered}"):  # listed among the choices
        ModelConfig(pos=registered + "x")


def test_the_recipes_encoding_decodes_exactly_from_the_cache(registered):
    check_cached_decoding(tiny(registered))


def test_the_recipes_chunked_bias_equals_the_explicit_path(registered, monkeypatch):
    monkeypatch.setattr(routes, "MASK_CHUNK_ELEMENTS", 2 * 4 * 7 * 40)  # 7 queries a chunk
    cfg = ModelConfig(d_model=32, n_head=4, n_kv_head=2, pos=registered)
    attn, pe = Attention(cfg), build_positional(cfg)
    with torch.no_grad():
        pe.slope.uniform_(0.05, 0.5, generator=torch.Generator().manual_seed(0))
    q, k, v = torch.randn(2, 4, 40, 8), torch.randn(2, 2, 40, 8), torch.randn(2, 2, 40, 8)
    positions = torch.arange(40)
    fast = attn.attend_heads(q, k, v, positions, positions, pe, 0)[0]
    slow, _ = attn.attend_heads(q, k, v, positions, positions, pe, 0, return_weights=True)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
