"""Every python and bash snippet of README.md and docs/**/*.md runs, as the page says.

One test per page: its blocks run in order in a fresh directory, on a private Redis
(its URL and a key prefix in ``REDIS_LEASE_URL`` and ``REDIS_LEASE_PREFIX``), after the
page's named setup (tests/snippets/setups.py). A page with a background block (a
worker, the dashboard) is marked ``fleet``. The convention and its markers are in
tests/snippets/parse.py; tests/snippets/fixture.md uses every marker.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from tests.doc_pages import page_paths
from tests.redis_server import RedisServer
from tests.snippets.parse import Page, parse, read_page
from tests.snippets.runner import SnippetFailed, run_page
from tests.snippets.setups import SETUPS

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = "tests/snippets/fixture.md"

#: Every skipped block of the documentation, by page: a new skip is a visible change here.
SKIPS: dict[str, list[str]] = {
    "README.md": ["runs from a clone of the repository: the demo, and the test suite itself"],
}


def page_params() -> list[Any]:
    """One pytest param per page, ``fleet`` where a block runs in the background."""
    params: list[Any] = []
    for path in page_paths():
        page = read_page(ROOT, path)
        marks = [pytest.mark.fleet] if page.fleet else []
        params.append(pytest.param(path, marks=marks, id=path))
    return params


@pytest.fixture
def page_store(private_redis: Callable[..., RedisServer], prefix: str) -> LeaseStore:
    """A store on a Redis of the page's own (its RQ queues too), under the test's prefix."""
    server = private_redis()
    return LeaseStore.from_url(server.url, prefix=prefix)


def run(page: Page, tmp_path: Path, store: LeaseStore) -> int:
    """Runs ``page`` in a new empty directory under ``tmp_path``; the blocks run."""
    workdir = tmp_path / "page"
    workdir.mkdir()
    return run_page(page, workdir, store, SETUPS)


@pytest.mark.parametrize("path", page_params())
def test_every_snippet_of_the_page_runs(path: str, tmp_path: Path, page_store: LeaseStore) -> None:
    page = read_page(ROOT, path)
    runnable = [s for s in page.snippets if s.file is None and not s.skip]
    assert run(page, tmp_path, page_store) == len(runnable)


def test_the_skipped_snippets_are_these() -> None:
    found: dict[str, list[str]] = {}
    for path in page_paths():
        for _, reason in read_page(ROOT, path).skips:
            found.setdefault(path, []).append(reason)
    assert found == SKIPS


@pytest.mark.fleet
def test_the_fixture_page_uses_every_marker(tmp_path: Path, page_store: LeaseStore) -> None:
    page = read_page(ROOT, FIXTURE)
    assert page.problems == []
    assert page.setup == "fixture-items" and page.fleet
    assert [s.file for s in page.snippets if s.file] == ["counting.py", "work.py"]
    assert page.skips == [(63, "the runner's own test of a skipped block")]
    assert [s.expect for s in page.snippets if s.expect] == [
        ["0 done of 3"],
        ["made by the setup", "succeeded"],
    ]
    assert run(page, tmp_path, page_store) == 3  # two foreground blocks, one background
    assert page_store.status("fixture:2026-12-02").counts["done"] == 3


def failure(text: str, tmp_path: Path, store: LeaseStore) -> str:
    """The message of running page ``text`` (it must fail)."""
    with pytest.raises(SnippetFailed) as failed:
        run(parse("docs/page.md", text), tmp_path, store)
    return str(failed.value)


def test_a_failing_block_is_named_by_page_line_command_and_output(
    tmp_path: Path, real_store: LeaseStore
) -> None:
    text = "# Page\n\n```bash\necho fine\n```\n\n```bash\necho about to fail\nfalse\n```\n"
    message = failure(text, tmp_path, real_store)
    assert message.startswith("docs/page.md:7: the bash block exited 1\n")
    assert "echo about to fail\nfalse" in message and "--- its output:\nabout to fail" in message


def test_an_expected_text_missing_from_the_output_fails(
    tmp_path: Path, real_store: LeaseStore
) -> None:
    text = "```python\nprint('hello')\n```\n<!-- expect: goodbye -->\n"
    message = failure(text, tmp_path, real_store)
    assert message.startswith("docs/page.md:1: the python block its output lacks 'goodbye'")


def test_a_background_block_that_dies_fails_the_page(
    tmp_path: Path, real_store: LeaseStore
) -> None:
    text = (
        # it ignores SIGTERM, so it exits 3 whether or not the runner's stop comes first
        "<!-- run: background -->\n```bash\ntrap '' TERM; echo starting; exit 3\n```\n\n"
        "```bash\necho the page goes on\n```\n"
    )
    message = failure(text, tmp_path, real_store)
    assert message.startswith("docs/page.md:2: the bash block (background) exited 3\n")
    assert "starting" in message


def test_a_background_block_gets_sigterm_when_the_page_ends(
    tmp_path: Path, real_store: LeaseStore
) -> None:
    text = (
        "<!-- run: background -->\n```bash\ntrap 'echo stopped > ../stopped; exit 0' TERM\n"
        "echo up > ../up\nwhile true; do sleep 0.05; done\n```\n\n"
        "```bash\nfor _ in $(seq 200); do test -e ../up && break; sleep 0.05; done\n```\n"
    )
    run(parse("docs/page.md", text), tmp_path, real_store)
    assert (tmp_path / "stopped").read_text() == "stopped\n"


def test_blocks_that_would_not_run_and_stray_markers_are_problems() -> None:
    text = (
        "```sh\nredis-lease runs\n```\n\n<!-- file: x.py -->\n\nprose\n\n"
        "<!-- run: sometimes -->\n```bash\ntrue\n```\n<!-- run: setup late-run -->\n"
        "<!-- run: skip -->\n```bash\ntrue\n```\n"
    )
    assert parse("docs/page.md", text).problems == [
        "line 1: a ```sh block is neither run nor output: write ```bash",
        "line 5: marker 'file: x.py' is not right above a block",
        "line 9: unknown marker 'run: sometimes'",
        "line 13: a setup marker goes on the first line",
        "line 14: a skip marker gives its reason",
    ]


def test_python_snippets_reach_the_tests_redis_and_prefix(
    tmp_path: Path, page_store: LeaseStore
) -> None:
    """``redis://localhost:6379/0`` (not the page's Redis) and the default prefix
    become the test's; the command line reads the same from the environment."""
    assert ":6379/" not in page_store.url
    text = (
        "```python\nimport redis\nfrom redis_lease import Item, LeaseStore\n"
        "store = LeaseStore.from_url('redis://localhost:6379/0')\n"
        "store.add('seen:1', [Item('a', {})])\n"
        "print(store.prefix, redis.Redis.from_url('redis://127.0.0.1:6379/2').dbsize())\n```\n"
        f"<!-- expect: {page_store.prefix} -->\n\n"
        '```bash\nredis-lease status seen:1 --json\n```\n<!-- expect: "total": 1 -->\n'
    )
    run(parse("docs/page.md", text), tmp_path, page_store)
    assert page_store.status("seen:1").total == 1


def test_a_background_block_the_page_kills_with_sigkill_is_no_failure(
    tmp_path: Path, real_store: LeaseStore
) -> None:
    """A tutorial's ``kill -9`` of its worker: the block ends by SIGKILL, as the page meant."""
    text = (
        "<!-- run: background -->\n```bash\necho $$ > ../pid; exec sleep 600\n```\n\n"
        "```bash\nfor _ in $(seq 200); do test -s ../pid && break; sleep 0.05; done\n"
        "kill -9 $(cat ../pid)\n```\n"
    )
    run(parse("docs/page.md", text), tmp_path, real_store)


def test_scripts_test_sh_runs_the_fleet_pages() -> None:
    """CI's ``make test`` deselects no marker: fleet pages run there."""
    script = (ROOT / "scripts" / "test.sh").read_text()
    command = next(line for line in script.splitlines() if "-m pytest" in line)
    assert command.startswith("exec .venv/bin/python -m pytest "), command
    assert " -m " not in command.split("pytest", 1)[1] and command.endswith(' "$@"'), command
    assert "addopts" not in (ROOT / "pyproject.toml").read_text()
