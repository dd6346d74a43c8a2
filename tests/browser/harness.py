"""The browser tests' harness: Debian's Chromium under Playwright, the dashboard as a
subprocess, the CLI's JSON, and the screenshots kept as test artifacts.

Playwright never downloads a browser here: it launches the Chromium of Debian's
``chromium`` package (``/usr/bin/chromium``, or ``REDIS_LEASE_CHROMIUM``), headless.
Without it the tests are skipped, except under ``CI=true``, where they fail
(``scripts/ensure-browser.sh`` installs it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fleet_helpers import REPO, Processes
from tests.redis_server import free_port

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

DEFAULT_CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: The line the dashboard prints to stderr once it listens.
SERVING = "serving the dashboard on "
#: The page width of every screenshot (the README's images too).
WIDTH = 1280
CLI = str(Path(sys.executable).with_name("redis-lease"))
ARTIFACTS = REPO / "tests" / "artifacts"
DOC_IMAGES = REPO / "docs" / "images"


def _missing(message: str) -> None:
    """Fails under CI=true, else skips, with ``message``."""
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def chromium_path() -> str:
    """The Chromium to launch; fails (CI) or skips when it or Playwright is missing."""
    path = os.environ.get("REDIS_LEASE_CHROMIUM") or DEFAULT_CHROMIUM
    if not os.access(path, os.X_OK):
        _missing(f"no Chromium at {path}: run scripts/ensure-browser.sh (apt-get install chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        _missing("Playwright is not installed: pip install -e '.[dev]' (or pip install playwright)")
    return path


@contextmanager
def chromium() -> Iterator[Browser]:
    """A headless Chromium under Playwright, closed afterwards."""
    path = chromium_path()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=path, headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield browser
        finally:
            browser.close()


@dataclass(frozen=True)
class Dashboard:
    """A running ``redis-lease dashboard`` process and its base URL (ending in '/')."""

    process: subprocess.Popen[bytes]
    url: str
    name: str


def start_dashboard(
    procs: Processes,
    redis_url: str,
    prefix: str,
    *options: str,
    name: str = "dashboard",
    timeout: float = 30.0,
) -> Dashboard:
    """Starts ``redis-lease --url URL --prefix P dashboard --port FREE [options]`` and waits
    for its "serving the dashboard on" line."""
    port = free_port()
    args = [CLI, "--url", redis_url, "--prefix", prefix, "dashboard", "--port", str(port)]
    process = procs.start([*args, *options], {}, name)
    deadline = time.monotonic() + timeout
    while True:
        for line in procs.log(name).splitlines():
            if SERVING in line:
                url = line.split(SERVING, 1)[1].strip()
                return Dashboard(process, url if url.endswith("/") else f"{url}/", name)
        if process.poll() is not None:
            raise AssertionError(f"the dashboard exited {process.returncode}: {procs.log(name)}")
        if time.monotonic() > deadline:
            raise AssertionError(f"the dashboard did not listen in {timeout}s: {procs.log(name)}")
        time.sleep(0.05)


def cli_json(redis_url: str, prefix: str, *args: str) -> Any:
    """Runs ``redis-lease --url URL --prefix P ARGS --json`` and returns its JSON."""
    command = [CLI, "--url", redis_url, "--prefix", prefix, *args, "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, f"{' '.join(command)} exited {done.returncode}: {done.stderr}"
    return json.loads(done.stdout)


def artifacts() -> Path:
    """Where screenshots go: ``$REDIS_LEASE_ARTIFACTS``, else tests/artifacts/."""
    directory = Path(os.environ.get("REDIS_LEASE_ARTIFACTS") or ARTIFACTS)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def updating_doc_images() -> bool:
    """True when ``REDIS_LEASE_UPDATE_SCREENSHOTS=1``: the README's images are refreshed."""
    return os.environ.get("REDIS_LEASE_UPDATE_SCREENSHOTS") == "1"


def screenshot(page: Page, name: str, width: int = WIDTH) -> Path:
    """Saves the whole page, ``width`` pixels wide, as ``<artifacts>/<name>.png``; returns
    the path."""
    path = artifacts() / f"{name}.png"
    viewport = page.viewport_size
    page.set_viewport_size({"width": width, "height": 240})  # the image ends where the page does
    try:
        page.screenshot(path=str(path), full_page=True)
    finally:
        if viewport is not None:
            page.set_viewport_size(viewport)
    return path
