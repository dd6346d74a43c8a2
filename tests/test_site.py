"""The documentation site's generated parts: the API reference names every public name
once, and the CLI reference (made by scripts/mkdocs_hooks.py at build time) every command."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import redis_lease

ROOT = Path(__file__).resolve().parent.parent


def hooks() -> ModuleType:
    """scripts/mkdocs_hooks.py, the module mkdocs loads."""
    spec = importlib.util.spec_from_file_location("mkdocs_hooks", ROOT / "scripts/mkdocs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_api_reference_documents_every_public_name_once() -> None:
    page = (ROOT / "docs/reference/api.md").read_text()
    documented = re.findall(r"^::: redis_lease\.(\w+)$", page, re.MULTILINE)
    assert sorted(documented) == sorted(redis_lease.__all__)
    assert len(documented) == len(set(documented))


def test_the_cli_reference_has_every_command_and_its_options() -> None:
    module = hooks()
    text = module.cli_reference()
    names = module.command_names()
    assert {"worker", "status", "runs", "requeue", "dashboard"} <= set(names)
    for name in names:
        assert f"## `redis-lease {name}`" in text, name
    assert "* `--url <str>`" in text and "REDIS_LEASE_URL" in text
    page = (ROOT / "docs/reference/cli.md").read_text()
    assert page.count(module.PLACEHOLDER) == 1


def test_mkdocs_builds_the_docs_with_warnings_as_errors() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert "\nstrict: true\n" in config and "scripts/mkdocs_hooks.py" in config
    assert "mkdocs build --strict" in (ROOT / "scripts/docs.sh").read_text()
    assert "make docs" in (ROOT / ".ci/run").read_text()
