"""The built wheel, installed in clean virtual environments: the core install runs a
worker, the tick and the command line's views and holds no web framework; each extra
installs and enables its feature; a feature without its extra says which to install.

One environment per install (core, each extra), made once for the module; packages come
from the built wheel and, for its dependencies, the package index pip is configured with.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from redis_lease.extras import EXTRAS

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
#: Distributions of the optional features: none of them is in a core install.
OPTIONAL = {
    "flask",
    "flask-wtf",
    "waitress",
    "werkzeug",
    "jinja2",
    "wtforms",
    "prometheus-client",
    "fakeredis",
    "lupa",
}
#: Distributions every fresh environment has, not counted as what an install pulls in.
BOOTSTRAP = {"pip", "setuptools"}
JOB_MODULE = """
from datetime import timedelta

from redis_lease import Job

wheeljob = Job("wheeljob", shards=2, deadline_after=timedelta(minutes=10), queue={queue!r})


@wheeljob.planner
def plan(business_date):
    from redis_lease import Item

    for n in range(6):
        yield Item(f"item-{{n}}", {{"n": n}})


@wheeljob.handler
def handle(item, lease):
    return {{"n": item.payload["n"]}}
"""


class Env:
    """A clean virtual environment with the wheel installed (with ``extra`` when given)."""

    def __init__(self, path: Path, wheel: Path, extra: str | None) -> None:
        self.path = path
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=120)
        target = f"{wheel}[{extra}]" if extra else str(wheel)
        self.pip("install", "--quiet", "--disable-pip-version-check", target)

    def pip(self, *args: str) -> str:
        """Runs this environment's pip; returns its output."""
        done = subprocess.run(
            [str(self.path / "bin" / "python"), "-m", "pip", *args],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        return done.stdout

    def packages(self) -> set[str]:
        """The distributions installed, by lower-case name, the bootstrap ones left out."""
        lines = self.pip("list", "--format=freeze", "--disable-pip-version-check").split()
        names = {line.split("==")[0].lower().replace("_", "-") for line in lines}
        return names - BOOTSTRAP

    def run(
        self, *args: str, cwd: Path, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """``redis-lease ARGS`` of this environment, run in ``cwd``."""
        done = subprocess.run(
            [str(self.path / "bin" / "redis-lease"), *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check:
            assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done

    def python(self, code: str, cwd: Path) -> str:
        """Runs ``code`` with this environment's Python; returns its stdout."""
        done = subprocess.run(
            [str(self.path / "bin" / "python"), "-c", textwrap.dedent(code)],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The package's wheel, built from this checkout."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(ROOT)],
        check=True,
        timeout=300,
    )
    (built,) = out.glob("redis_lease-*.whl")
    return built


@pytest.fixture(scope="module")
def env(
    wheel: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[str | None], Env]]:
    """The environment of an install (None: the core), made on first use."""
    made: dict[str | None, Env] = {}

    def get(extra: str | None) -> Env:
        if extra not in made:
            made[extra] = Env(tmp_path_factory.mktemp(f"venv-{extra or 'core'}"), wheel, extra)
        return made[extra]

    yield get


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    """A directory away from the checkout, so that only the installed package imports."""
    return tmp_path


def test_the_core_install_works_without_any_extra(
    env: Callable[[str | None], Env],
    cwd: Path,
    redis_url: str,
    prefix: str,
    queue_name: str,
    record_property: Callable[[str, object], None],
) -> None:
    core = env(None)
    installed = core.packages()
    record_property("core_packages", len(installed))
    assert not installed & OPTIONAL, installed & OPTIONAL
    assert {"redis-lease", "redis", "rq", "typer", "croniter"} <= installed
    base = ["--url", redis_url, "--prefix", prefix]
    assert "worker" in core.run("--help", cwd=cwd).stdout
    assert core.run(*base, "runs", "--json", cwd=cwd).stdout.strip() == "[]"
    # A small run: started (planned, dispatched), worked by a burst worker, then shown.
    (cwd / "wheeljobs.py").write_text(JOB_MODULE.format(queue=queue_name))
    started = json.loads(core.run(*base, "start", "wheeljobs:wheeljob", "--json", cwd=cwd).stdout)
    run_id = str(started["run"])
    core.run(*base, "worker", "--burst", "--queue", queue_name, cwd=cwd, timeout=300)
    status = json.loads(core.run(*base, "status", run_id, "--json", cwd=cwd).stdout)
    assert status["counts"]["done"] == 6, status
    core.run(*base, "tick", "wheeljobs:wheeljob", cwd=cwd)


@pytest.mark.parametrize(
    ("args", "extra", "feature"),
    [
        (["dashboard"], "dashboard", "the dashboard"),
        (["metrics"], "metrics", "redis-lease metrics"),
        (["demo"], "demo", "the demo"),
        (["--url", "fakeredis://x", "runs"], "demo", "the embedded backend (fakeredis://)"),
    ],
)
def test_a_feature_of_a_missing_extra_names_it(
    env: Callable[[str | None], Env],
    wheel: Path,
    cwd: Path,
    args: list[str],
    extra: str,
    feature: str,
) -> None:
    """The line installs the extra from the wheel this copy came from (not on the index)."""
    done = env(None).run("--url", "redis://127.0.0.1:1/0", *args, cwd=cwd, check=False)
    assert done.stderr == (
        f"error: {feature} needs the extra {extra!r}: pip install '{wheel.resolve()}[{extra}]'\n"
    )
    assert done.returncode == 10


def test_the_dashboard_extra_serves_the_dashboard(
    env: Callable[[str | None], Env],
    cwd: Path,
    redis_url: str,
    prefix: str,
    record_property: Callable[[str, object], None],
) -> None:
    dashboard = env("dashboard")
    record_property("dashboard_packages", len(dashboard.packages()))
    command = [str(dashboard.path / "bin" / "redis-lease"), "--url", redis_url]
    command += ["--prefix", prefix, "dashboard", "--port", "0"]
    server = subprocess.Popen(command, cwd=cwd, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stderr is not None
        line = server.stderr.readline()  # written once it listens
        assert line.startswith("serving the dashboard on http://"), line
        base = line.split(" on ", 1)[1].strip().rstrip("/")
        with urllib.request.urlopen(f"{base}/healthz", timeout=30) as reply:
            assert reply.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=30) as reply:
            assert b"redis_lease_" in reply.read()
    finally:
        server.terminate()
        server.wait(timeout=30)
        if server.stderr is not None:
            server.stderr.close()


def test_the_metrics_extra_prints_the_metrics(
    env: Callable[[str | None], Env], cwd: Path, redis_url: str, prefix: str
) -> None:
    done = env("metrics").run("--url", redis_url, "--prefix", prefix, "metrics", cwd=cwd)
    assert "# TYPE redis_lease_" in done.stdout


def test_the_demo_extra_brings_the_embedded_backend(
    env: Callable[[str | None], Env], cwd: Path
) -> None:
    demo = env("demo")
    assert set(EXTRAS["demo"]) == {"fakeredis", "lupa"}
    shown = demo.run("--url", "fakeredis://wheel", "runs", "--json", cwd=cwd)
    assert shown.stdout.strip() == "[]"
    code = """
        from redis_lease.protocol.connection.clients import client_from_url
        client = client_from_url("fakeredis://wheel")
        print(client.eval("return 1 + 1", 0))
    """
    assert demo.python(code, cwd).strip() == "2"
