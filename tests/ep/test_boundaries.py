"""ep/ moves bytes: from engine/ it imports only engine/kernels/ and the contract (every import,
function-level ones included), and never daemon/, lifecycle/ or telemetry/. What a rank needs to
load arrives as plain data and an engine-side loader passed in (ep/spec.py), which stays torch-free."""
from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

import ep

PACKAGE = pathlib.Path(ep.__file__).parent
# ep/moe.py (the MoE layer) moves into the model in this same restructure (issue 25), and with it
# its imports of the engine's config, phases and MLP; every other module is held to the rule now.
MOVING_OUT = {"moe.py"}
MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name not in MOVING_OUT)


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "engine":
            names.update(f"engine.{alias.name}" for alias in node.names)  # `from engine import kernels`
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _allowed(name: str) -> bool:
    root = name.split(".")[0]
    if root in ("daemon", "lifecycle", "telemetry"):
        return False
    if root != "engine":
        return True
    return name == "engine.contract" or name == "engine.kernels" or name.startswith(("engine.kernels.",
                                                                                      "engine.contract."))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_ep_imports_only_kernels_and_the_contract_from_the_engine(path: pathlib.Path) -> None:
    bad = sorted(n for n in _imports(ast.parse(path.read_text())) if not _allowed(n))
    assert not bad, f"ep/{path.relative_to(PACKAGE)} imports {bad}"


def test_the_rule_catches_what_it_must() -> None:
    tree = ast.parse("def f():\n    from engine.config import ModelConfig\nimport engine.kernels.moe_route\n"
                     "from engine import startup_log\nfrom engine import kernels\n")
    assert sorted(n for n in _imports(tree) if not _allowed(n)) == ["engine.config", "engine.startup_log"]


def test_the_spec_ep_is_given_is_plain_data_without_torch() -> None:
    """ep.spec carries the kernel configuration, a torch-free leaf of engine/kernels, and nothing
    else of the engine."""
    probe = ("import sys, ep.spec, ep.log; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'engine')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=PACKAGE.parent)
    assert out.stdout.strip() == "['engine', 'engine.kernels', 'engine.kernels.config']"


def test_the_engines_loader_reaches_spawned_ranks_by_name() -> None:
    """multiprocessing's spawn pickles the loader by its qualified name: it must be module-level."""
    import pickle

    from engine.ep_setup import ep_spec, load_rank_experts
    from engine.engine import EngineSpec
    spec = ep_spec(EngineSpec(random_preset="tiny", backend="host-staged", ep_size=2))
    assert spec.loader is load_rank_experts
    assert pickle.loads(pickle.dumps(spec)) == spec
