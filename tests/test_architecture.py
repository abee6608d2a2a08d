"""The structure the layer contract (pyproject.toml, checked by lint-imports) cannot see.

No nanoattn import hides in a function body (it would dodge the layer order), no module imports
another's private name, and every library file stays readable in one sitting.
"""

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted([*(REPO / "nanoattn").rglob("*.py"), *(REPO / "scripts").glob("*.py")])
MAX_LINES = 400


def _imports(tree: ast.AST):
    """(node, imported module, imported names) for every import statement, with its enclosing function."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child, alias.name, [], function
            elif isinstance(child, ast.ImportFrom):
                yield child, child.module or "", [a.name for a in child.names], function
            yield from walk(child, inner)

    yield from walk(tree, None)


def _rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_nanoattn_import_inside_a_function(path):
    tree = ast.parse(path.read_text())
    deferred = [f"line {node.lineno} in {function}()" for node, module, _, function in _imports(tree)
                if function is not None and module.split(".")[0] == "nanoattn"]
    assert deferred == []


@pytest.mark.parametrize("path", SOURCES, ids=_rel)
def test_no_private_name_is_imported_from_another_module(path):
    tree = ast.parse(path.read_text())
    private = [f"{module}.{name}" for _, module, names, _ in _imports(tree) for name in names
               if name.startswith("_") and not name.startswith("__")]
    assert private == []


@pytest.mark.parametrize("path", sorted((REPO / "nanoattn").rglob("*.py")), ids=_rel)
def test_library_files_stay_short(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


def test_the_checks_see_a_deferred_and_a_private_import():
    source = ("import os\n"
              "def f():\n    from nanoattn.model import GPT\n    from nanoattn.config import _fail\n")
    found = list(_imports(ast.parse(source)))
    assert [(module, function) for _, module, _, function in found] == [
        ("os", None), ("nanoattn.model", "f"), ("nanoattn.config", "f")]
    assert found[2][2] == ["_fail"]
