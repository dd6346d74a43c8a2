"""The documentation site's generated parts: the API reference names every public name
once, with its docstrings' roles rendered and its defaults as values; the CLI reference
(made by scripts/mkdocs_hooks.py at build time) every command, as ``--help`` shows it."""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import typer
import typer.main
from typer.testing import CliRunner

import redis_lease
from redis_lease.cli import app
from redis_lease.cli.help_text import COMMAND_GROUPS, summary
from redis_lease.limits import DEFAULT_TTL, MAX_RETRY_RATE, TTL_MAX_MS, TTL_MIN_MS

ROOT = Path(__file__).resolve().parent.parent
#: What is left of a Sphinx role that was not rendered (``:meth:`x``` or ``:meth:x``).
UNRENDERED_ROLE = re.compile(r":(?:py:)?(?:attr|meth|func|class|mod|data|exc|obj|const|ref):`?")
#: Typer's own names for a value, which the reference and ``--help`` must not show:
#: ``<str>``, ``<bool>``, ``<int range>``, ``<list[str]>``, and ``{run}`` in a usage line.
TYPER_METAVAR = re.compile(r"<(?:str|bool|int|float|list\[[^\]]*\])(?: range)?>|\{[a-z_]+\}")
#: The ranges the store and the capacity plan enforce, as the help states them.
TTL_RANGE = f"{TTL_MIN_MS / 1000:g} to {TTL_MAX_MS // 1000} seconds"
RETRY_RATE_RANGE = f"0 to {MAX_RETRY_RATE}"


def load_script(name: str) -> ModuleType:
    """scripts/<name>.py, as mkdocs loads it."""
    spec = importlib.util.spec_from_file_location(name, ROOT / f"scripts/{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def hooks() -> ModuleType:
    """scripts/mkdocs_hooks.py, the module mkdocs loads."""
    return load_script("mkdocs_hooks")


def every_command() -> Iterator[tuple[list[str], Any]]:
    """Each command's words after ``redis-lease`` (the root's: none) and the command."""
    root: Any = typer.main.get_command(app)

    def under(words: list[str], command: Any) -> Iterator[tuple[list[str], Any]]:
        yield words, command
        if hasattr(command, "list_commands"):
            ctx = typer.Context(command)
            for name in command.list_commands(ctx):
                yield from under([*words, name], command.get_command(ctx, name))

    yield from under([], root)


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
    assert "* `--url TEXT`" in text and "REDIS_LEASE_URL" in text
    page = (ROOT / "docs/reference/cli.md").read_text()
    assert page.count(module.PLACEHOLDER) == 1


def test_the_cli_reference_names_values_plainly_and_states_the_enforced_ranges() -> None:
    text = hooks().cli_reference()
    assert TYPER_METAVAR.findall(text) == []
    assert "$ redis-lease claim [OPTIONS] RUN [ITEM]\n" in text
    assert "$ redis-lease add [OPTIONS] RUN [ITEMS]...\n" in text
    assert "* `RUN`: Run id" in text
    assert "* `--json`: Print JSON on stdout." in text  # a flag: no value named
    ttl = re.findall(r"^\* `--ttl SECONDS`: (.*)$", text, re.MULTILINE)
    assert len(ttl) == 2 and all(TTL_RANGE in line for line in ttl), ttl  # claim, renew
    (retry,) = re.findall(r"^\* `--retry-rate NUMBER`: (.*)$", text, re.MULTILINE)
    assert RETRY_RATE_RANGE in retry


def test_the_cli_reference_lists_the_commands_in_groups_with_whole_summaries() -> None:
    text = hooks().cli_reference()
    listed = re.findall(
        r"^\*\*(.+)\*\*:$|^\* \[`([a-z-]+)`\]\(#redis-lease-\2\): (.*)$", text, re.M
    )
    groups = [group for group, _, _ in listed if group and group in COMMAND_GROUPS]
    assert groups == list(COMMAND_GROUPS)
    named = [name for _, name, _ in listed if name]
    assert named == [name for names in COMMAND_GROUPS.values() for name in names]
    sections = re.findall(r"^### `redis-lease ([a-z-]+)`$", text, re.MULTILINE)
    assert sections == named
    root: Any = typer.main.get_command(app)
    ctx = typer.Context(root)
    for _, name, line in listed:
        if name:
            whole = summary(root.get_command(ctx, name).help)
            assert html.unescape(line) == whole and not whole.endswith("..."), name
    assert (
        "List runs, newest first: state, counts, failed shard jobs; paused jobs are named" in text
    )


def test_help_names_values_plainly_as_the_reference_does() -> None:
    runner = CliRunner()
    seen = 0
    for words, _ in every_command():
        done = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
        assert done.exit_code == 0, (words, done.output)
        assert TYPER_METAVAR.findall(done.output) == [], (words, done.output)
        seen += 1
    assert seen > 30
    claim = runner.invoke(app, ["claim", "--help"], env={"COLUMNS": "200"}).output
    assert "Usage: redis-lease claim [OPTIONS] RUN [ITEM]" in claim
    assert re.search(r"--ttl +SECONDS +Lease time to live: " + re.escape(TTL_RANGE), claim)
    assert re.search(r"--json +Print JSON on stdout", claim)  # a flag: no value named
    top = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).output
    panels = re.findall(r"─ ([A-Z][a-z ]+?) ─", top)
    assert panels[-len(COMMAND_GROUPS) :] == list(COMMAND_GROUPS), panels


def _griffe_package() -> Any:
    """redis_lease as the API reference loads it: with griffe's dataclasses extension and
    scripts/api_reference.py, as mkdocs.yml lists them."""
    import griffe

    assert (
        "extensions: [dataclasses, scripts/api_reference.py]" in (ROOT / "mkdocs.yml").read_text()
    )
    extensions = griffe.load_extensions("dataclasses", str(ROOT / "scripts/api_reference.py"))
    return griffe.load("redis_lease", search_paths=[str(ROOT)], extensions=extensions)


def test_the_api_reference_renders_every_role_and_shows_defaults_as_values() -> None:
    package = _griffe_package()
    objects = list(load_script("api_reference").objects(package))
    docstrings = {o.path: o.docstring.value for o in objects if o.docstring is not None}
    assert len(docstrings) > 500
    left = {path: UNRENDERED_ROLE.findall(text) for path, text in docstrings.items()}
    assert {path: roles for path, roles in left.items() if roles} == {}
    store = package.get_member("LeaseStore").final_target
    renew = store.all_members["renew"]
    assert str(renew.parameters["ttl"].default) == repr(DEFAULT_TTL)
    job = package.get_member("Job").final_target.get_member("__init__")
    assert str(job.parameters["lease_ttl_seconds"].default) == repr(DEFAULT_TTL)
    named = {
        f"{o.path}({p.name})": str(p.default)
        for o in objects
        if o.is_function
        for p in o.parameters
        if re.fullmatch(r"\(?[A-Z][A-Z0-9_]{2,},?\)?", str(p.default))
    }
    assert named == {}
    claim = store.all_members["claim"].docstring.value  # ":meth:`claim_next`": a link
    assert "<code>claim_next()</code></autoref>" in claim


def test_the_built_site_shows_no_role_and_the_references_read_plainly(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20
    for page in pages:
        text = html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))
        assert UNRENDERED_ROLE.findall(text) == [], page
    api = (site / "reference/api/index.html").read_text()
    assert 'href="#redis_lease.LeaseStore.claim_next"><code>claim_next()</code></a>' in api
    signatures = html.unescape(re.sub(r"<[^>]+>", "", api))
    assert f"ttl: float = {DEFAULT_TTL!r}" in signatures
    assert "DEFAULT_TTL" not in signatures
    cli = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference/cli/index.html").read_text()))
    assert TYPER_METAVAR.findall(cli) == []
    assert f"--ttl SECONDS: Lease time to live: {TTL_RANGE}" in cli
    assert (
        f"--retry-rate NUMBER: Share of attempts that do not finish their item: {RETRY_RATE_RANGE}"
        in cli
    )


def test_mkdocs_builds_the_docs_with_warnings_as_errors() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    assert "\nstrict: true\n" in config and "scripts/mkdocs_hooks.py" in config
    assert "mkdocs build --strict" in (ROOT / "scripts/docs.sh").read_text()
    assert "make docs" in (ROOT / ".ci/run").read_text()
