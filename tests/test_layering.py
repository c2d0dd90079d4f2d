"""The layers of DESIGN.md, pinned over every import of daemon/, engine/, ep/, lifecycle/ and
telemetry/ (function-level and TYPE_CHECKING ones included; tests/layering.py reads them with ast):
no import cycle between modules; lifecycle/ is the standard library and engine/contract only;
telemetry/ adds only OpenTelemetry, prometheus-client and python-json-logger; engine/ and ep/ never
import daemon/, lifecycle/ or telemetry/; ep/ takes only engine/kernels/ and the contract from engine/; the contract
is stdlib-only; daemon/ takes from engine/ only the contract and the pieces it wires. And the house
limits: no file over 400 lines (the packages and tools/), no function over 8 positional parameters,
a docstring and postponed annotations in every module. A second set of tests feeds the checker a
fake tree to show that each rule catches what it is meant to."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests import layering as L

ROOT = Path(__file__).resolve().parents[1]

# Known violations still being fixed: each entry is exempt from its rule (and an import edge from the
# cycle check). Empty since issue 25 landed; the tests below fail on any entry that no longer
# matches a violation.
PENDING_IMPORTS: frozenset[tuple[str, str]] = frozenset()  # (importing file, imported module)
PENDING_LONG_FILES: frozenset[str] = frozenset()
PENDING_WIDE_FUNCTIONS: frozenset[str] = frozenset()  # "path name"


def _pending_import(imp: L.Import) -> bool:
    return (imp.path, imp.target) in PENDING_IMPORTS


@pytest.fixture(scope="module")
def found() -> list[L.Import]:
    return L.imports(ROOT)


def test_every_import_respects_the_layers(found):
    broken = [f"{imp.where()}: imports {imp.target}: {why}" for imp in found
              if (why := L.layer_problem(imp)) is not None and not _pending_import(imp)]
    assert not broken, "\n".join(broken)


def test_no_import_cycle_between_modules(found):
    edges = L.graph([imp for imp in found if not _pending_import(imp)], set(L.sources(ROOT)))
    assert not (loops := L.cycles(edges)), "\n".join(" -> ".join(c) for c in loops)


def test_no_file_over_400_lines():
    long = {p: n for p, n in L.long_files(ROOT).items() if p not in PENDING_LONG_FILES}
    assert not long, long


def test_no_function_over_8_positional_parameters():
    wide = {k: n for k, n in L.wide_functions(ROOT).items()
            if f"{k.split(':')[0]} {k.split(' ', 1)[1]}" not in PENDING_WIDE_FUNCTIONS}
    assert not wide, wide


def test_the_pending_exemptions_are_all_still_needed(found):
    """An entry that no longer matches a violation is stale: remove it (the lead empties them)."""
    broken = {(imp.path, imp.target) for imp in found if L.layer_problem(imp) is not None}
    cycle_edges = {(imp.path, imp.target) for imp in found if imp.target in set(L.sources(ROOT))}
    assert PENDING_IMPORTS <= broken | cycle_edges, PENDING_IMPORTS - broken - cycle_edges
    assert PENDING_LONG_FILES <= set(L.long_files(ROOT)), PENDING_LONG_FILES - set(L.long_files(ROOT))
    wide = {f"{k.split(':')[0]} {k.split(' ', 1)[1]}" for k in L.wide_functions(ROOT)}
    assert PENDING_WIDE_FUNCTIONS <= wide, PENDING_WIDE_FUNCTIONS - wide


@pytest.mark.parametrize("path", [p for pkg in L.PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))
                                  if p.read_text().strip()], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_module_has_the_house_shape(path):
    source = path.read_text()
    assert ast.get_docstring(ast.parse(source)), "no module docstring"
    assert "from __future__ import annotations" in source


def test_importing_lifecycle_and_telemetry_loads_nothing_of_the_gpu_side():
    probe = ("import sys, pegainfer.lifecycle, pegainfer.lifecycle.scheduler, pegainfer.telemetry.hub, "
             "pegainfer.telemetry.setup; "
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton') "
             "or m.startswith(('pegainfer.ep', 'pegainfer.daemon')) "
             "or (m.startswith('pegainfer.engine.') and m != 'pegainfer.engine.contract')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


# ---- the checker catches what it is meant to: a small fake tree ---------------------------------------
def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for pkg in L.PACKAGES:
        (root / pkg).mkdir(exist_ok=True)
        (root / pkg / "__init__.py").touch()
    return root


def _problems(root: Path) -> dict[tuple[str, str], str]:
    return {(imp.path, imp.target): why for imp in L.imports(root) if (why := L.layer_problem(imp)) is not None}


def test_the_checker_reports_a_cycle_through_function_level_imports(tmp_path):
    root = _tree(tmp_path, {
        "engine/a.py": "import pegainfer.engine.b\n",
        "engine/b.py": "def later():\n    from pegainfer.engine import c\n",
        "engine/c.py": "from . import a\n",  # relative, back to the start
        "engine/d.py": "import pegainfer.engine.a\n",  # reaches the cycle, not part of it
    })
    found = L.imports(root)
    assert any(imp.target == "engine.c" and imp.in_function for imp in found)
    loops = L.cycles(L.graph(found, set(L.sources(root))))
    assert loops == [["engine.a", "engine.b", "engine.c", "engine.a"]]


def test_the_checker_reports_each_layer_rule(tmp_path):
    root = _tree(tmp_path, {
        "engine/contract.py": "import dataclasses\nimport pegainfer.engine.model\n",
        "engine/model.py": "import torch\ndef f():\n    import pegainfer.telemetry.hub\n",
        "engine/kernels/argmax.py": "import triton\n",
        "ep/moe.py": ("from pegainfer.engine.kernels import argmax\nfrom pegainfer.engine.contract import X\n"
                      "from pegainfer.engine.model import M\n"),
        "lifecycle/s.py": ("from pegainfer.engine.contract import Admit\nimport asyncio\n"
                           "if False:\n    import torch\nfrom pegainfer.ep import moe\nfrom pegainfer.engine import model\nimport orjson\n"),
        "telemetry/hub.py": ("import opentelemetry.trace\nfrom prometheus_client import Counter\n"
                             "from pegainfer.engine.contract import StepRecord\nimport pegainfer.daemon.settings\n"
                             "import importlib\nimportlib.import_module('starlette.routing')\n"),
        "daemon/app.py": ("import starlette\nfrom pegainfer.engine.contract import Admit\nfrom pegainfer.engine.engine import Engine\n"
                          "from pegainfer.engine.sampler import Draw\nimport pegainfer.lifecycle.s\nimport pegainfer.telemetry.hub\n"),
        "engine/engine.py": "from pegainfer.lifecycle import s\n",
        "engine/bare.py": "import engine.contract\ndef f():\n    from ep import registry\n",
        "ep/registry.py": "",
    })
    problems = _problems(root)
    expected = {
        ("engine/contract.py", "engine.model"): "engine/contract imports beyond",
        ("engine/model.py", "telemetry.hub"): "engine/ imports telemetry/",
        ("engine/engine.py", "lifecycle.s"): "engine/ imports lifecycle/",
        ("ep/moe.py", "engine.model"): "ep/ imports engine/ beyond",
        ("lifecycle/s.py", "torch"): "lifecycle/ imports torch",
        ("lifecycle/s.py", "ep.moe"): "lifecycle/ imports ep/",
        ("lifecycle/s.py", "engine.model"): "lifecycle/ imports engine/ beyond the contract",
        ("lifecycle/s.py", "orjson"): "lifecycle/ imports beyond",
        ("telemetry/hub.py", "daemon.settings"): "telemetry/ imports beyond",
        ("telemetry/hub.py", "starlette.routing"): "telemetry/ imports beyond",
        ("daemon/app.py", "engine.sampler"): "daemon/ takes from engine/ beyond",
        ("engine/bare.py", "engine.contract"): "imports engine.contract by its bare name",
        ("engine/bare.py", "ep.registry"): "imports ep.registry by its bare name",
    }
    assert set(problems) == set(expected), set(problems) ^ set(expected)
    for key, start in expected.items():
        assert problems[key].startswith(start), (key, problems[key])


def test_the_checker_reports_long_files_and_wide_functions(tmp_path):
    root = _tree(tmp_path, {
        "tools/long.py": "x = 1\n" * 401,
        "engine/ok.py": "x = 1\n" * 400,
        "engine/wide.py": ("def nine(a, b, c, d, e, f, g, h, i):\n    pass\n"
                           "def eight(a, b, c, d, e, f, g, h, *rest, i=0, j=1):\n    pass\n"
                           "def keywords(a, b, c, d, e, f, g, h, *, i, j):\n    pass\n"
                           "class K:\n    def method(self, a, b, c, d, e, f, g, h):\n        pass\n"
                           "    def more(self, a, b, c, d, e, f, g, h, i):\n        pass\n"
                           "    @staticmethod\n    def static(self, a, b, c, d, e, f, g, h):\n        pass\n"
                           "lam = lambda a, b, c, d, e, f, g, h, i: 0\n"),
        "engine/kernels/k.py": ("import triton\n@triton.jit\ndef _kernel(a, b, c, d, e, f, g, h, i):\n    pass\n"
                                "@triton.jit(do_not_specialize=['a'])\ndef _kernel2(a, b, c, d, e, f, g, h, i):\n"
                                "    pass\n@other.jit\ndef not_triton(a, b, c, d, e, f, g, h, i):\n    pass\n"),
    })
    assert L.long_files(root) == {"tools/long.py": 401}
    assert L.wide_functions(root) == {"engine/wide.py:1 nine": 9, "engine/wide.py:10 more": 9,
                                      "engine/wide.py:13 static": 9, "engine/wide.py:15 <lambda>": 9,
                                      "engine/kernels/k.py:9 not_triton": 9}
