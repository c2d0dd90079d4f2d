"""lifecycle/ stays pure: standard library and itself only (no torch, engine/, ep/, daemon/),
and every module keeps the house shape (future annotations, a docstring, under 300 lines)."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import lifecycle

PACKAGE = pathlib.Path(lifecycle.__file__).parent
MODULES = sorted(PACKAGE.glob("*.py"))


def _imported_roots(tree: ast.Module) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_imports_only_the_standard_library_and_lifecycle(path: pathlib.Path) -> None:
    tree = ast.parse(path.read_text())
    foreign = {root for root in _imported_roots(tree)
               if root != "lifecycle" and root not in sys.stdlib_module_names}
    assert not foreign, f"{path.name} imports {sorted(foreign)}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.name)
def test_module_has_the_house_shape(path: pathlib.Path) -> None:
    source = path.read_text()
    tree = ast.parse(source)
    assert ast.get_docstring(tree), f"{path.name} has no module docstring"
    assert "from __future__ import annotations" in source
    assert len(source.splitlines()) < 300


def test_importing_lifecycle_loads_no_gpu_side_package() -> None:
    probe = ("import sys, lifecycle; "
             "print(sorted(m for m in ('torch', 'engine', 'ep', 'daemon') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent)
    assert out.stdout.strip() == "[]"
