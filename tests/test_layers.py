"""The package's modules import each other one way only: no import circles.

Every module of ``redis_lease`` is parsed with ``ast``; an edge A -> B is any import in A
of a module B of the package (``from . import x`` counts as an import of ``x`` when ``x``
is a module): at module level, inside functions, and under ``if TYPE_CHECKING:`` alike,
since an import deferred into a function still ties the two modules together.
"""

from __future__ import annotations

import ast
import re
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


#: The layers, lowest first: a module imports modules of its own room or of a lower layer,
#: never of a higher one nor of another room of its own layer (docs/architecture.md). The
#: fleet's concept folders (jobs, runs, effects, capacity, transport, loss) are one room:
#: they import each other (no circle, checked below), and worker and tick stand above them.
LAYERS: list[dict[str, tuple[str, ...]]] = [
    {"floor": ("errors", "limits", "messages", "version", "extras")},
    {"protocol": ("protocol",)},
    {"protocol/connection": ("protocol.connection",)},
    {"protocol/store": ("protocol.store",)},
    {"fleet": ("fleet",)},
    {"fleet/worker": ("fleet.worker",), "fleet/tick": ("fleet.tick",)},
    {"operate": ("operate",)},
    {"operate/metrics": ("operate.metrics",)},
    {"operate/dashboard": ("operate.dashboard",)},
    {"demo": ("demo",)},
    {"runner": ("runner",)},
    {"cli": ("cli",)},
]
#: Above every layer: the package's face, ``python -m``, and the three modules whose paths
#: RQ jobs and command lines store (``worker``, ``tick``, ``dispatch``; docs/upgrading.md).
FACES = {
    "redis_lease",
    "redis_lease.__main__",
    "redis_lease.worker",
    "redis_lease.tick",
    "redis_lease.dispatch",
}


def room_of(module: str) -> tuple[int, str]:
    """The layer (its rank, lowest 0) and room of a module: the room of the longest prefix."""
    found: tuple[int, str, int] | None = None
    for rank, rooms in enumerate(LAYERS):
        for room, prefixes in rooms.items():
            for prefix in prefixes:
                full = f"redis_lease.{prefix}"
                inside = module == full or module.startswith(full + ".")
                if inside and (found is None or len(full) > found[2]):
                    found = (rank, room, len(full))
    if found is None:
        return len(LAYERS), "face"
    return found[0], found[1]


def wrong_way(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points up a layer, or across to another room of the same layer."""
    found = []
    for importer, targets in sorted(graph.items()):
        rank, room = room_of(importer)
        for target in sorted(targets):
            target_rank, target_room = room_of(target)
            if target_rank > rank or (target_rank == rank and target_room != room):
                found.append(f"{importer} ({room}) -> {target} ({target_room})")
    return found


def test_every_module_has_a_room() -> None:
    faces = {name for name in MODULES if room_of(name)[1] == "face"}
    assert faces == FACES, "a module outside every layer: give it a room in LAYERS"


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    assert {"redis_lease.__main__", "redis_lease.errors", "redis_lease.demo.runner"} <= set(graph)
    shard_job = "redis_lease.fleet.worker.shard_job"
    assert "redis_lease.errors" in graph[shard_job]
    assert "redis_lease.protocol.store.lease_store" in graph["redis_lease.demo.runner"]
    assert "redis_lease.fleet.jobs.live_lease" in graph["redis_lease.fleet.jobs.job"], (
        "under TYPE_CHECKING"
    )
    assert "redis_lease.fleet.worker.rq_worker" in graph["redis_lease.cli.fleet"], "in a function"


def test_the_checker_finds_a_circle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_checker_finds_a_wrong_way_import() -> None:
    up = {"redis_lease.protocol.keys": {"redis_lease.fleet.runs.lifecycle"}}
    across = {"redis_lease.fleet.tick.due_runs": {"redis_lease.fleet.worker.pool"}}
    down = {"redis_lease.cli.app": {"redis_lease.errors", "redis_lease.fleet.runs.lifecycle"}}
    assert wrong_way(up) == [
        "redis_lease.protocol.keys (protocol) -> redis_lease.fleet.runs.lifecycle (fleet)"
    ]
    assert len(wrong_way(across)) == 1
    assert wrong_way(down) == []


def test_no_import_circles() -> None:
    assert cycles(import_graph()) == []


def test_every_import_points_down() -> None:
    assert wrong_way(import_graph()) == []


#: The fleet's concept folders, one concept each; its top keeps at most FLEET_TOP modules.
FLEET_CONCEPTS = ("jobs", "runs", "effects", "capacity", "transport", "loss", "worker", "tick")
FLEET_TOP = 8


def test_the_fleet_keeps_its_concepts_in_folders() -> None:
    fleet = PACKAGE / "fleet"
    folders = {path.parent.name for path in fleet.glob("*/__init__.py")}
    assert folders == set(FLEET_CONCEPTS)
    assert len(list(fleet.glob("*.py"))) <= FLEET_TOP
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    for folder in FLEET_CONCEPTS:
        assert f"fleet/{folder}/" in page, f"docs/architecture.md names fleet/{folder}/"


def test_the_architecture_page_shows_these_layers() -> None:
    """docs/architecture.md's table lists the rooms of LAYERS, in order, with their ranks."""
    page = (PACKAGE.parent / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| `([a-z/]+)` \|", page, re.MULTILINE)
    expected = [(str(rank), room) for rank, rooms in enumerate(LAYERS) for room in rooms]
    assert rows == expected
    for rooms in LAYERS:
        for room, prefixes in rooms.items():
            if room != "floor":  # a folder, or one module (runner.py)
                folder = PACKAGE.joinpath(*prefixes[0].split("."))
                module = folder.with_suffix(".py")
                assert (folder / "__init__.py").is_file() or module.is_file(), f"{room} exists"
