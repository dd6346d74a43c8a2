"""Every public name a user meets is importable from ``redis_lease``, wherever it lives.

The names a user meets: every exception and warning class of the library; every class
in a library module's ``__all__`` (what its functions return or take); and every class
and function the README, docs/ and examples/ name under a module path
(``from redis_lease.fleet.effects import not_sent``, ``redis_lease.dispatch.JsonJob``). The
command line (``redis_lease.cli``) and the demo (``redis_lease.demo``) are programs, not
the library: their names stay where they are. A name that is also a module of the
package (``redis_lease.tick``, the module, and its function ``tick``) cannot be both, and
keeps its module path.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

import redis_lease

ROOT = Path(__file__).resolve().parent.parent
#: Subpackages that are programs, not the library.
PROGRAMS = ("redis_lease.cli", "redis_lease.demo")
#: Where the docs name things: ``from redis_lease.mod import A, B`` and ``redis_lease.mod.Name``.
_FROM = re.compile(r"from (redis_lease(?:\.\w+)+) import \(?([\w\s,]+)\)?")
_DOTTED = re.compile(r"\b(redis_lease(?:\.\w+)+)")


def library_modules() -> dict[str, ModuleType]:
    """Every module of the package but the programs', imported."""
    found = {"redis_lease": redis_lease}
    for info in pkgutil.walk_packages(redis_lease.__path__, "redis_lease."):
        if info.name.startswith(PROGRAMS) or info.name.endswith("__main__"):
            continue
        found[info.name] = importlib.import_module(info.name)
    return found


def is_submodule(name: str) -> bool:
    """``name`` is also a module or package of redis_lease (a file or a folder)."""
    return (Path(redis_lease.__file__).parent / name).with_suffix(".py").exists() or (
        Path(redis_lease.__file__).parent / name / "__init__.py"
    ).exists()


def exceptions_and_warnings() -> dict[str, str]:
    """Every public exception and warning class the library defines: name -> module."""
    found: dict[str, str] = {}
    for module_name, module in library_modules().items():
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == module_name
                and not name.startswith("_")
            ):
                found[name] = module_name
    return found


def classes_in_all() -> dict[str, str]:
    """Every class a library module lists in its ``__all__``: name -> module."""
    found: dict[str, str] = {}
    for module_name, module in library_modules().items():
        for name in getattr(module, "__all__", ()):
            if inspect.isclass(getattr(module, name)):
                found[name] = module_name
    return found


def documented_names() -> dict[str, str]:
    """Every class and function the README, docs/ and examples/ name under a module path."""
    texts = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    texts += sorted((ROOT / "examples").rglob("*.py")) + sorted((ROOT / "examples").rglob("*.md"))
    found: dict[str, str] = {}
    for path in texts:
        text = path.read_text()
        pairs = [(m, n.strip()) for m, names in _FROM.findall(text) for n in names.split(",")]
        for dotted in _DOTTED.findall(text):
            module, _, name = dotted.rpartition(".")
            pairs.append((module, name))
        for module_name, name in pairs:
            if not name or module_name.startswith(PROGRAMS):
                continue
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue  # a module path, not a module and a name
            value = getattr(module, name, None)  # a class or function (cached ones too)
            if callable(value) and not isinstance(value, ModuleType) and not is_submodule(name):
                found[name] = f"{module_name} ({path.relative_to(ROOT)})"
    return found


def test_the_sources_of_public_names_find_what_they_should() -> None:
    """The scanners are not vacuous: names known to be in each source are found."""
    assert {"EvictionPolicyWarning", "LeaseLost", "InsecureTLSWarning"} <= set(
        exceptions_and_warnings()
    )
    assert {"CapacityPlan", "Scripts", "Decision", "ShardReport"} <= set(classes_in_all())
    documented = documented_names()
    assert {"JsonJob", "LeaseCollector", "not_sent", "resolve_effect", "source"} <= set(documented)
    assert "tick" not in documented, "a function named as a module of the package is left out"
    assert not any(where.startswith(PROGRAMS) for where in documented.values())


@pytest.mark.parametrize(
    "source", [exceptions_and_warnings, classes_in_all, documented_names], ids=lambda f: f.__name__
)
def test_every_public_name_is_importable_from_the_package(source: object) -> None:
    assert callable(source)
    names: dict[str, str] = source()
    missing = sorted(f"{n} ({where})" for n, where in names.items() if n not in redis_lease.__all__)
    assert not missing, f"not in redis_lease.__all__: {missing}"
    for name, where in names.items():
        module = importlib.import_module(where.split(" ")[0])
        assert getattr(redis_lease, name) is getattr(module, name), f"{name} of {where}"


def test_every_name_of_all_imports_and_the_light_ones_need_no_rq() -> None:
    """``from redis_lease import *`` gives every name; a bare import does not load RQ or
    Prometheus's client (the names that need them import their module on first use)."""
    code = (
        "import sys, redis_lease\n"
        "heavy = [m for m in ('rq', 'prometheus_client') if m in sys.modules]\n"
        "from redis_lease import *\n"
        "names = dict(globals())\n"
        "missing = [n for n in redis_lease.__all__ if n not in names]\n"
        "print(heavy, missing)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[] []", done.stdout + done.stderr


def test_eviction_policy_warning_is_the_one_the_store_warns_with() -> None:
    from redis_lease import EvictionPolicyWarning
    from redis_lease.protocol.connection.server_checks import warn_unless_noeviction

    assert issubclass(EvictionPolicyWarning, UserWarning)
    assert "EvictionPolicyWarning" in inspect.getsource(warn_unless_noeviction)
