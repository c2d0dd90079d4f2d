"""The checker behind tests/test_layering.py: every import of every module of the packages (those
inside functions and under TYPE_CHECKING too, and importlib.import_module / __import__ of a literal
name), read with ast from a source tree, checked against the layers of DESIGN.md; plus the import
cycles between modules, and the house limits on file length and positional parameters.

Module names are the folders' (`engine.model` for engine/model.py): the installed distribution maps
the folders under one import package, so code imports `pegainfer.engine.model`; the checker reads such
a target as `engine.model`, and flags an import of a folder by its bare name (`engine.model`), which
resolves only from a checkout, never from the installed package.

Pure functions of a root folder, so that tests can feed it a small fake tree as well as the repo."""
from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterable
from pathlib import Path

PACKAGES = ("daemon", "engine", "ep", "lifecycle", "telemetry")
DISTRIBUTION = "pegainfer"  # the one import package the folders are installed under (pyproject.toml)
SIZED = (*PACKAGES, "tools")  # no file over MAX_LINES lines here
MAX_LINES = 400
MAX_POSITIONAL = 8  # positional parameters of a function, a method's self or cls not counted
CONTRACT = "engine.contract"
TELEMETRY_MAY_USE = ("opentelemetry", "prometheus_client", "pythonjsonlogger")  # spans, metrics, log lines
EP_MAY_USE = ("engine.kernels", CONTRACT)
# What the daemon wires together from engine/ besides the contract: the builder and its spec and
# errors, the GPU thread, the tokenizer, offline generation, the start-up warm-up, the structured log,
# capacity defaults, the kernel configuration (built from settings).
# Request data never comes from these: it is the contract's.
DAEMON_WIRES = ("engine.engine", "engine.loop", "engine.tokenizer", "engine.generate", "engine.warmup",
                "engine.startup_log",
                "engine.config", "engine.weights", "engine.kv_capacity", "engine.default_model", "engine.ep_setup",
                "engine.kernels.config")


@dataclasses.dataclass(frozen=True, slots=True)
class Import:
    path: str  # the importing file, relative to the root ("engine/model.py")
    source: str  # its module ("engine.model")
    target: str  # the module imported, absolute: a project module where one is named (no "pegainfer.")
    line: int
    in_function: bool
    bare: bool = False  # a folder imported by its bare name, not through the pegainfer package

    def where(self) -> str:
        return f"{self.path}:{self.line}{' (inside a function)' if self.in_function else ''}"


def module_of(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources(root: Path, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    """Every .py file of the packages under `root`: module name -> path."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            out[module_of(path.relative_to(root))] = path
    return out


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]) -> None:
        self.module, self.is_package, self.known = module, is_package, known
        self.found: list[tuple[str, int, bool]] = []
        self._depth = 0  # functions (and lambdas) around the node being visited

    def _scoped(self, node: ast.AST) -> None:
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _scoped

    def _add(self, target: str, node: ast.AST, *, relative: bool = False) -> None:
        """target as written (absolute, or resolved from a relative import): stored without the
        distribution's prefix, with whether it named a folder by its bare name."""
        bare = not relative and target.split(".")[0] in PACKAGES
        self.found.append((target.removeprefix(DISTRIBUTION + "."), node.lineno, self._depth > 0, bare))

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = node.module or ""
        if node.level:  # relative: resolved against this module's package
            package = self.module.split(".") if self.is_package else self.module.split(".")[:-1]
            package = package[:len(package) - (node.level - 1)]
            base = ".".join([*package, *([base] if base else [])])
        plain = base.removeprefix(DISTRIBUTION + ".")
        for alias in node.names:
            sub = f"{plain}.{alias.name}" if plain else alias.name
            # `from pegainfer.engine import kernels` names the module engine.kernels
            target = sub if sub in self.known else plain
            prefix = base[:len(base) - len(plain)]
            self._add(prefix + target, node, relative=bool(node.level))

    def visit_Call(self, node: ast.Call) -> None:
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
        if name in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            self._add(node.args[0].value, node)
        self.generic_visit(node)


def imports(root: Path, packages: Iterable[str] = PACKAGES) -> list[Import]:
    files = sources(root, packages)
    known = set(files)
    out = []
    for module, path in files.items():
        visitor = _Imports(module, path.name == "__init__.py", known)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        rel = path.relative_to(root).as_posix()
        out += [Import(rel, module, target, line, inner, bare) for target, line, inner, bare in dict.fromkeys(visitor.found)]
    return out


def _under(module: str, *prefixes: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names


def layer_problem(imp: Import) -> str | None:
    """Why this import breaks the layers of DESIGN.md; None if it does not."""
    s, t = imp.source, imp.target
    if imp.bare:
        return f"imports {t} by its bare name: the installed package is {DISTRIBUTION}.{t.split('.')[0]}"
    if _under(t, "tools", "tests"):
        return "a package imports tools/ or tests/"
    if _under(s, CONTRACT):
        return None if _stdlib(t) or _under(t, CONTRACT) else "engine/contract imports beyond the standard library"
    if _under(s, "lifecycle"):
        if _stdlib(t) or _under(t, "lifecycle", CONTRACT):
            return None
        if _under(t, "torch"):
            return "lifecycle/ imports torch"
        if _under(t, "ep"):
            return "lifecycle/ imports ep/"
        if _under(t, "engine"):
            return "lifecycle/ imports engine/ beyond the contract"
        return "lifecycle/ imports beyond the standard library and the contract"
    if _under(s, "telemetry"):
        if _stdlib(t) or _under(t, "telemetry", CONTRACT, *TELEMETRY_MAY_USE):
            return None
        return ("telemetry/ imports beyond the standard library, OpenTelemetry, prometheus-client, python-json-logger "
                "and the contract")
    if _under(s, "engine", "ep") and _under(t, "daemon", "lifecycle", "telemetry"):
        return f"{s.split('.')[0]}/ imports {t.split('.')[0]}/"
    if _under(s, "ep") and _under(t, "engine") and not _under(t, *EP_MAY_USE):
        return "ep/ imports engine/ beyond engine/kernels/ and the contract"
    if _under(s, "daemon") and _under(t, "engine") and not _under(t, CONTRACT, *DAEMON_WIRES):
        return "daemon/ takes from engine/ beyond the contract and the pieces it wires"
    return None


def graph(found: list[Import], known: set[str]) -> dict[str, set[str]]:
    """Module -> the project modules it imports (a package's submodule import names the submodule)."""
    edges: dict[str, set[str]] = {m: set() for m in known}
    for imp in found:
        if imp.target in known and imp.target != imp.source:
            edges[imp.source].add(imp.target)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a -> b -> ... -> a) per strongly connected group of modules that import each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm; the graphs are small enough to recurse
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(edges) + 100))
    try:
        for v in sorted(edges):
            if v not in index:
                connect(v)
    finally:
        sys.setrecursionlimit(limit)
    return [_cycle_in(sorted(g)[0], g, edges) for g in groups]


def _cycle_in(start: str, group: set[str], edges: dict[str, set[str]]) -> list[str]:
    """The shortest path start -> ... -> start inside `group` (breadth first)."""
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges[v] & group):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [start, *reversed(path[:-1]), start] if v != start else [start, start]
                if w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")


def long_files(root: Path, folders: Iterable[str] = SIZED, limit: int = MAX_LINES) -> dict[str, int]:
    """Python files of more than `limit` lines: relative path -> lines."""
    out = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            n = len(path.read_text().splitlines())
            if n > limit:
                out[path.relative_to(root).as_posix()] = n
    return out


def _is_triton_jit(d: ast.expr) -> bool:
    """`@triton.jit` or `@triton.jit(...)`."""
    d = d.func if isinstance(d, ast.Call) else d
    return isinstance(d, ast.Attribute) and d.attr == "jit" and isinstance(d.value, ast.Name) and d.value.id == "triton"


def wide_functions(root: Path, folders: Iterable[str] = SIZED, limit: int = MAX_POSITIONAL) -> dict[str, int]:
    """Functions (methods and lambdas too) of more than `limit` positional parameters, a method's
    leading self or cls not counted: "path:line name" -> how many. Triton kernels (`@triton.jit`)
    are exempt: a kernel's launch passes its pointers, sizes and strides positionally, and their
    Python wrappers, which callers use, follow the rule."""
    out = {}
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            methods = {id(f) for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body
                       if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
            for f in ast.walk(tree):
                if not isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                    continue
                if any(_is_triton_jit(d) for d in getattr(f, "decorator_list", [])):
                    continue
                params = [*f.args.posonlyargs, *f.args.args]
                static = any(isinstance(d, ast.Name) and d.id == "staticmethod"
                             for d in getattr(f, "decorator_list", []))
                if id(f) in methods and not static and params and params[0].arg in ("self", "cls"):
                    params = params[1:]
                if len(params) > limit:
                    name = getattr(f, "name", "<lambda>")
                    out[f"{path.relative_to(root).as_posix()}:{f.lineno} {name}"] = len(params)
    return out
