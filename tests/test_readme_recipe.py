"""The README's recipes as written. The encoding's file, import line and registry line make an encoding
that configs accept and that the generic checks pass (cached decoding equal to recomputation, the chunked
bias equal to the explicit path). The mechanism's file, lines and field, written into a copy of the
package, pass the generic tests there. Pasted into a clone, each passes the whole suite: the checks of
hand-written pages report it as not yet covered (tests/coverage.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
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


# --- the mechanism recipe -----------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]
# The generic tests a registered mechanism meets through its lab row, run on the recipe's mechanism alone.
GENERIC = {
    "tests/mechanisms/test_registry.py": ("test_its_fields_are_config_fields_off_by_default",
                                          "test_a_bad_value_is_a_one_line_error_naming_the_field",
                                          "test_the_bare_reference_and_a_plain_export_refuse_it_in_one_line",
                                          "test_sdpa_serves_it_exactly_when_it_says_so",
                                          "test_cached_decoding_is_exact_with_each_kv_layout"),
    "tests/test_generate.py": ("test_cached_decoding_with_attention_variants",
                               "test_every_pair_of_variants_builds_or_is_refused_in_one_line"),
    "tests/model/test_attention_variants.py": ("test_a_variant_model_learns_and_its_maps_are_distributions",),
    "tests/eval/test_heads.py": ("test_attention_maps_of_the_variants_equal_their_fast_path",),
}


def mechanism_recipe() -> dict[str, str]:
    """The README's mechanism recipe: its file's path and code, and the lines it adds to the registry's
    module, to ModelConfig and to ATTENTION_VARIANTS."""
    block = re.search(r"```python\n# (nanoattn/mechanisms/\w+\.py)\n(.*?)```", README, re.DOTALL)
    path, code = block.groups()
    sentence = README.split(code + "```\n\n", 1)[1].split("\n\n", 1)[0].replace("\n", " ")
    lines = re.findall(r"`([^`]+)`", sentence)
    return dict(path=path, code=code, name=re.search(r'"(\w+)": \w+,', sentence).group(1),
                import_line=next(line for line in lines if line.startswith("from ")),
                registry_line=next(line for line in lines if re.fullmatch(r'"\w+": [A-Z]\w+,', line)),
                field_line=next(line for line in lines if re.fullmatch(r"\w+: \w+ = .+", line)),
                row_line=next(line for line in lines if re.fullmatch(r'"\w+": dict\(.*\),', line)))


def insert_before(text: str, anchor: str, line: str) -> str:
    """``text`` with ``line`` inserted before the first line from ``anchor`` on that closes a block."""
    start = text.index(anchor)
    close = text.index("\n}\n", start)
    return text[:close] + f"\n    {line}" + text[close:]


def test_the_mechanism_recipe_pasted_into_a_copy_passes_the_generic_tests(tmp_path):
    """The recipe as a user follows it: its file, its import and registry line, its ModelConfig field
    and its ATTENTION_VARIANTS row, written into a copy of the package; the generic tests, run on that
    copy in a process of their own, pass for it: config checks and one-line refusals, SDPA kept,
    cached decoding past the training length with MHA, GQA and MQA, every pair built or refused,
    learning, and head analysis's maps equal to the fast path."""
    recipe = mechanism_recipe()
    copy = tmp_path / "repo"
    for folder in ("nanoattn", "tests", "scripts", "configs"):
        shutil.copytree(REPO / folder, copy / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", copy)
    (copy / recipe["path"]).write_text(recipe["code"])

    def paste(path: str, line: str, add) -> None:  # once: a clone the recipe was pasted into keeps its own
        file = copy / path
        if line not in file.read_text():
            file.write_text(add(file.read_text()))

    registry = "nanoattn/mechanisms/__init__.py"
    paste(registry, recipe["import_line"],
          lambda text: text.replace("\n\nREGISTRY", f"\n{recipe['import_line']}\n\nREGISTRY", 1))
    paste(registry, recipe["registry_line"],
          lambda text: insert_before(text, "REGISTRY: dict", recipe["registry_line"]))
    field = f"    {recipe['field_line']}\n\n    def __post_init__"
    paste("nanoattn/config/model.py", recipe["field_line"],
          lambda text: text.replace("\n    def __post_init__", field, 1))
    paste("nanoattn/config/options.py", recipe["row_line"],
          lambda text: insert_before(text, "ATTENTION_VARIANTS: dict", recipe["row_line"]))
    tests = " or ".join(name for names in GENERIC.values() for name in names)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "0", "-q", "-rA", *GENERIC,
         "-k", f"({tests}) and {recipe['name']}"],
        cwd=copy, env={**os.environ, "PYTHONPATH": str(copy)}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    passed = re.findall(r"^PASSED (\S+)", result.stdout, re.MULTILINE)
    for file, names in GENERIC.items():
        for name in names:
            ran = [test for test in passed if test.startswith(f"{file}::{name}[")]
            assert any(recipe["name"] in test for test in ran), name
