"""The releases of CHANGELOG.md, and an earlier release built into a venv of its own.

Every ``## `` heading of the CHANGELOG is a release: ``## 0.9.0 - 2026-12-05 (commit
77e4ed9)``, or ``## 0.10.0 - unreleased`` for the one under way. :func:`previous` is the
newest release that names its commit, so that when the next release opens its section
the tests move on to this one by themselves. :func:`build` makes that commit runnable:
its tree installed by pip into a new venv, and its ``tests/`` apart, for its workers to
import their job module from (the job module of the commit's own tests imports only what
that release has).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHANGELOG = ROOT / "CHANGELOG.md"
#: A release's heading.
HEADING = re.compile(
    r"^## (?P<version>\d+\.\d+\.\d+) - (?:(?P<date>\d{4}-\d{2}-\d{2}) "
    r"\(commit (?P<commit>[0-9a-f]{7,40})\)|(?P<unreleased>unreleased))$"
)
#: Seconds pip may take to install a release (its dependencies come from pip's cache).
INSTALL_TIMEOUT = 900


@dataclass(frozen=True)
class Heading:
    """One release of the CHANGELOG."""

    version: str
    #: Its date and last commit; None while it is under way.
    date: str | None
    commit: str | None

    @property
    def number(self) -> tuple[int, ...]:
        """The version as numbers, for ordering."""
        return tuple(int(part) for part in self.version.split("."))


def headings(text: str | None = None) -> list[Heading]:
    """The CHANGELOG's releases, as written (newest first); fails on a heading of another form.

    ``text``: a CHANGELOG's text (default: this checkout's).
    """
    found = []
    for line in (CHANGELOG.read_text() if text is None else text).splitlines():
        if not line.startswith("## "):
            continue
        match = HEADING.match(line)
        if match is None:
            pytest.fail(f"CHANGELOG heading {line!r} is not '## X.Y.Z - DATE (commit C)'")
        found.append(Heading(match["version"], match["date"], match["commit"]))
    return found


def previous() -> Heading:
    """The newest release that names its commit (the one before the release under way)."""
    released = [heading for heading in headings() if heading.commit]
    if not released:
        pytest.fail("CHANGELOG.md names no release commit ('## X.Y.Z - DATE (commit C)')")
    return released[0]


@dataclass(frozen=True)
class Release:
    """An earlier release, installed into a venv of its own."""

    heading: Heading
    #: Its ``redis-lease`` command.
    command: Path
    #: A folder holding only its ``tests/`` (import root of its job modules).
    jobs: Path

    def env(self, *extra_paths: Path) -> dict[str, str]:
        """The environment of its processes: its own tests on the path, nothing of this
        checkout (``extra_paths`` are refused: they would mix the releases)."""
        assert not extra_paths, "a release's workers import from its own tree only"
        return {**os.environ, "PYTHONPATH": str(self.jobs)}


def _extract(commit: str, target: Path, *paths: str) -> None:
    """``git archive`` of the commit (or of ``paths`` in it) unpacked into ``target``."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", commit, *paths],
        capture_output=True,
        timeout=120,
    )
    if done.returncode != 0:
        pytest.fail(f"commit {commit} cannot be read: {done.stderr.decode(errors='replace')}")
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as archive:
        archive.extractall(target, filter="data")


def _run(command: list[str], what: str, timeout: float) -> None:
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")


def build(heading: Heading, directory: Path) -> Release:
    """Installs the release's commit into ``directory/venv`` (pip, with its dependencies).

    Fails the test, never skips it, when the commit is missing or does not build.
    """
    assert heading.commit is not None, f"release {heading.version} names no commit"
    _extract(heading.commit, directory / "source")
    _extract(heading.commit, directory / "jobs", "tests")
    venv = directory / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], f"a venv for {heading.version}", 120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    pip += ["--disable-pip-version-check", str(directory / "source")]
    _run(pip, f"installing release {heading.version} ({heading.commit})", INSTALL_TIMEOUT)
    release = Release(heading, venv / "bin" / "redis-lease", directory / "jobs")
    _check_imports(release, venv)
    return release


def _check_imports(release: Release, venv: Path) -> None:
    """Fails unless the release's processes import its package from its venv and the job
    module from its own tests (nothing of this checkout)."""
    program = "import redis_lease, tests.effect_jobs as j; print(redis_lease.__file__, j.__file__)"
    python = str(venv / "bin" / "python")
    done = subprocess.run(
        [python, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env=release.env(),
        cwd=release.jobs,
    )
    if done.returncode != 0:
        pytest.fail(f"release {release.heading.version} does not import:\n{done.stderr[-3000:]}")
    package, jobs = (Path(path).resolve() for path in done.stdout.split())
    assert package.is_relative_to(venv.resolve()), package
    assert jobs.is_relative_to(release.jobs.resolve()), jobs
