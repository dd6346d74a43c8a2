"""Runs a page's snippets in order, as one reader in one fresh directory.

``bash`` blocks run with ``bash -e``, ``python`` blocks as ``python snippet.py``, both
in the page's directory with ``REDIS_LEASE_URL`` and ``REDIS_LEASE_PREFIX`` set and the
venv's bin first on ``PATH``; ``site/`` on ``PYTHONPATH`` points a snippet's
``redis://localhost:6379/0`` at the test's Redis and prefix. A background block runs
until the page ends, then gets SIGTERM. A failure names the page, the block's line,
the command and its output.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from redis_lease import LeaseStore
from tests.snippets.parse import Page, Snippet

SITE = Path(__file__).resolve().parent / "site"
#: The CLI's environment variables: a page's are set by the runner only.
CLEARED = ("REDIS_LEASE_URL", "REDIS_URL", "REDIS_LEASE_PREFIX", "REDIS_LEASE_DEBUG")
TIMEOUT = 120.0  # seconds one foreground block may take
STOP_TIMEOUT = 15.0  # seconds a background block has to exit after SIGTERM
#: How a background block may end: 0, by the runner's SIGTERM, or by a SIGKILL the page
#: itself sent (a tutorial's ``kill -9`` of a worker); bash reports a signal as 128 + it.
STOPPED = (
    0,
    128 + signal.SIGTERM,
    -signal.SIGTERM,
    128 + signal.SIGKILL,
    -signal.SIGKILL,
)


class SnippetFailed(AssertionError):
    """A block exited non-zero, timed out, or its output lacked an expected text."""


def page_env(url: str, prefix: str) -> dict[str, str]:
    """The environment of a page's blocks."""
    env = {k: v for k, v in os.environ.items() if k not in CLEARED and k != "PYTHONPATH"}
    env["REDIS_LEASE_URL"] = url
    env["REDIS_LEASE_PREFIX"] = prefix
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(SITE)
    env["COLUMNS"] = "80"
    env["NO_COLOR"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass
class Background:
    """A block started in the background, and where its output goes."""

    snippet: Snippet
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        """What it printed so far."""
        return self.log.read_text(errors="replace")


@dataclass
class PageRun:
    """One page run: its directory, environment and background blocks."""

    page: Page
    workdir: Path
    env: dict[str, str]
    background: list[Background] = field(default_factory=list)
    ran: int = 0  # blocks run (foreground and background)

    def run(self) -> None:
        """Runs every block in order; stops the background ones at the end."""
        try:
            for snippet in self.page.snippets:
                if snippet.skip:
                    continue
                if snippet.file is not None:
                    target = self.workdir / snippet.file
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_text(snippet.code)
                elif snippet.background:
                    self.start(snippet)
                else:
                    self.foreground(snippet)
        except BaseException:
            self.stop_all(report=False)
            raise
        self.stop_all(report=True)

    def command(self, snippet: Snippet) -> list[str]:
        """The command that runs ``snippet`` (a python block is written to snippet.py)."""
        if snippet.language == "python":
            (self.workdir / "snippet.py").write_text(snippet.code)
            return ["python", "snippet.py"]
        return ["bash", "-e", "-c", snippet.code]

    def foreground(self, snippet: Snippet) -> None:
        """Runs a block to its end; it must exit 0 and show what its markers expect."""
        self.ran += 1
        try:
            done = subprocess.run(
                self.command(snippet),
                cwd=self.workdir,
                env=self.env,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
                start_new_session=True,
            )
        except subprocess.TimeoutExpired as timeout:
            out = _text(timeout.stdout) + _text(timeout.stderr)
            self.fail(snippet, f"did not end within {TIMEOUT:.0f} s", out)
        output = done.stdout + done.stderr
        if done.returncode != 0:
            self.fail(snippet, f"exited {done.returncode}", output)
        if "Traceback (most recent call last)" in done.stderr:
            self.fail(snippet, "printed a traceback", output)
        for text in snippet.expect:
            if text not in done.stdout:
                self.fail(snippet, f"its output lacks {text!r}", output)

    def start(self, snippet: Snippet) -> None:
        """Starts a background block in its own session, logging to a file."""
        self.ran += 1
        log = self.workdir.parent / f"background-{snippet.line}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                self.command(snippet),
                cwd=self.workdir,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.background.append(Background(snippet, process, log))

    def stop_all(self, report: bool) -> None:
        """SIGTERM to every background block's process group; SIGKILL past the timeout.

        With ``report``, a block that failed fails the page: one that exited non-zero
        on its own, or on SIGTERM other than by the signal, or did not stop in time."""
        problems: list[tuple[Background, str]] = []
        for item in self.background:
            _signal(item.process, signal.SIGTERM)
        for item in self.background:
            try:
                code = item.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                _signal(item.process, signal.SIGKILL)
                item.process.wait()
                problems.append((item, f"did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM"))
                continue
            if code not in STOPPED:
                problems.append((item, f"exited {code}"))
        stopped, self.background = self.background, []
        if problems and report:
            item, what = problems[0]
            self.fail(item.snippet, f"(background) {what}", item.output(), running=stopped)

    def fail(
        self,
        snippet: Snippet,
        what: str,
        output: str,
        running: list[Background] | None = None,
    ) -> None:
        """Raises :class:`SnippetFailed` naming the page, line, command and output."""
        lines = [
            f"{self.page.path}:{snippet.line}: the {snippet.language} block {what}",
            "--- the block:",
            snippet.code.rstrip(),
            "--- its output:",
            output.rstrip() or "(none)",
        ]
        for item in running if running is not None else self.background:
            if item.snippet is not snippet:
                lines += [f"--- background block of line {item.snippet.line}:", item.output()]
        raise SnippetFailed("\n".join(lines))


def _signal(process: subprocess.Popen[bytes], signum: int) -> None:
    """Sends ``signum`` to the process group of ``process`` (gone: nothing to do)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)


def _text(value: str | bytes | None) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def run_page(
    page: Page,
    workdir: Path,
    store: LeaseStore,
    setups: dict[str, Callable[[LeaseStore, Path], dict[str, str] | None]],
) -> int:
    """Runs ``page`` in the empty directory ``workdir`` on ``store``'s Redis and prefix
    (its named setup first, with the environment it adds); returns the number of blocks
    run."""
    if page.problems:
        raise SnippetFailed(f"{page.path}: " + "; ".join(page.problems))
    env = page_env(store.url, store.prefix)
    if page.setup is not None:
        if page.setup not in setups:
            known = ", ".join(sorted(setups))
            raise SnippetFailed(f"{page.path}:1: unknown setup {page.setup!r} (known: {known})")
        env.update(setups[page.setup](store, workdir) or {})
    runner = PageRun(page, workdir, env)
    runner.run()
    return runner.ran
