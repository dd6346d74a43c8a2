"""The package's modules import each other one way only: no import circles.

Every module of ``redis_lease`` is parsed with ``ast``; an edge A -> B is any import in A
of a module B of the package (``from . import x`` counts as an import of ``x`` when ``x``
is a module): at module level, inside functions, and under ``if TYPE_CHECKING:`` alike,
since an import deferred into a function still ties the two modules together.
"""

from __future__ import annotations

import ast
from pathlib import Path

import redis_lease

PACKAGE = Path(redis_lease.__file__).resolve().parent


def module_name(path: Path) -> str:
    """``redis_lease.demo.runner`` for ``redis_lease/demo/runner.py``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def all_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import of the module: at module level, in functions, under TYPE_CHECKING."""
    return [node for node in ast.walk(tree) if isinstance(node, ast.Import | ast.ImportFrom)]


def resolve(importer: str, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` names."""
    if node.level == 0:
        return node.module or ""
    is_package = MODULES[importer].name == "__init__.py"
    base = importer.split(".")
    base = base if is_package else base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(importer: str) -> set[str]:
    """The package's modules that ``importer`` imports, wherever the import stands."""
    tree = ast.parse(MODULES[importer].read_text(), filename=str(MODULES[importer]))
    targets: set[str] = set()
    for node in all_imports(tree):
        if isinstance(node, ast.Import):
            targets |= {alias.name for alias in node.names}
            continue
        source = resolve(importer, node)
        for alias in node.names:  # ``from . import x``: the module x, else the package
            submodule = f"{source}.{alias.name}"
            targets.add(submodule if submodule in MODULES else source)
    return {target for target in targets if target in MODULES and target != importer}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports."""
    return {name: imported_modules(name) for name in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert {"redis_lease.worker", "redis_lease.errors", "redis_lease.demo.runner"} <= set(graph)
    assert "redis_lease.errors" in graph["redis_lease.worker"]
    assert "redis_lease.store" in graph["redis_lease.demo.runner"]  # from ..store import
    assert "redis_lease.keeper" in graph["redis_lease.jobs"], "under TYPE_CHECKING"
    assert "redis_lease.dispatch" in graph["redis_lease.cli.fleet"], "inside a function"


def test_the_checker_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_worker_effects_gate_and_jobs_import_one_way() -> None:
    """They shared their error types in a circle; the types now live in errors.py."""
    graph = import_graph()
    fleet = ["jobs", "effects", "gate", "worker"]
    for number, low in enumerate(fleet):
        above = {f"redis_lease.{high}" for high in fleet[number + 1 :]}
        assert not graph[f"redis_lease.{low}"] & above, f"{low} imports a module above it"
    assert graph["redis_lease.errors"] <= {"redis_lease.limits"}
    assert "redis_lease.jobs" not in graph["redis_lease.effects"], "for PermanentError"
    assert "redis_lease.effects" not in graph["redis_lease.gate"], "for Throttled"
