"""What the README and docs/ name exists as they name it: every dotted ``redis_lease.x.y``
path resolves, every library class named in code is importable from ``redis_lease``, and
what ``make test`` installs is said next to it."""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import pytest

import redis_lease
from tests.doc_pages import pages

ROOT = Path(__file__).resolve().parent.parent
FENCED = re.compile(r"^```\w*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def resolve(dotted: str) -> Any:
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ModuleNotFoundError(dotted)


def dotted_paths() -> list[tuple[str, str]]:
    """(page, path) of every ``redis_lease.x.y`` the pages name."""
    found = set()
    for page, text in pages().items():
        for dotted in re.findall(r"\bredis_lease(?:\.[A-Za-z_]\w*)+", text):
            found.add((page, dotted.rstrip(".")))
    return sorted(found)


@pytest.mark.parametrize(("page", "dotted"), dotted_paths(), ids=lambda v: str(v))
def test_every_dotted_path_the_docs_name_resolves(page: str, dotted: str) -> None:
    assert resolve(dotted) is not None


def library_classes() -> set[str]:
    """Every class a module of the library (not the programs) defines."""
    found = set()
    for name in redis_lease.__all__:
        value = getattr(redis_lease, name)
        if isinstance(value, type):
            found.add(name)
    for module_name in ("errors", "fleet.jobs.job", "protocol.leases", "fleet.runs.lifecycle"):
        module = importlib.import_module(f"redis_lease.{module_name}")
        for attr, value in vars(module).items():
            if isinstance(value, type) and value.__module__ == module.__name__:
                found.add(attr)
    return found


def test_every_library_class_named_in_code_imports_from_redis_lease() -> None:
    classes = library_classes()
    named = set()
    for text in pages().values():
        spans = re.findall(r"`([^`\n]+)`", FENCED.sub("", text))
        code = " ".join(spans + FENCED.findall(text))
        named |= set(re.findall(r"\b[A-Z][a-z]+[A-Za-z]*\b", code)) & classes
    assert {"Job", "LeaseStore", "Item"} <= named
    missing = sorted(name for name in named if name not in redis_lease.__all__)
    assert missing == [], "named in the docs but not importable from redis_lease"


def test_the_docs_say_what_make_test_installs_and_how_to_run_without() -> None:
    """Every package an ensure script installs or fetches is named next to ``make test``."""
    scripts = "".join(path.read_text() for path in (ROOT / "scripts").glob("ensure-*.sh"))
    packages = set(re.findall(r"apt-get (?:install|download) [^\n]*?(\S+) >/dev/null", scripts))
    assert packages == {"redis-server", "faketime", "chromium", "prometheus"}
    paragraphs = [p for t in pages().values() for p in t.split("\n\n")]
    said = [p for p in paragraphs if p.startswith("`make test` may install")]
    assert said, "no page says what `make test` may install (a paragraph starting so)"
    for package in packages:
        assert f"`{package}`" in said[0], package
    assert "CI=true" in said[0] and ".venv/bin/pytest" in said[0]
