"""The examples' commands work end to end and their reports say nothing was lost or doubled.

Each command runs as a subprocess against a private redis-server of this module:
the examples start RQ workers on queues of their own naming, and a private
server keeps every key they leave out of the shared Redis.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def example_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a private redis-server for the examples."""
    server = RedisServer(tmp_path_factory.mktemp("examples-redis"))
    server.start()
    yield server.url
    server.kill()


def run_example(
    *args: str,
    timeout: float = 180,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Runs an example script; returns its JSON report (it must exit 0)."""
    done = subprocess.run(
        [python, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def all_keys(url: str) -> dict[str, int]:
    """Every key of the examples' private server, with its TTL (-1: none, it stays for ever)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return {key: client.ttl(key) for key in client.scan_iter(count=1000)}
    finally:
        client.close()


def plain_python() -> str:
    """A python3 outside the project's venv, one that cannot import redis_lease or its needs."""
    candidates = [getattr(sys, "_base_executable", ""), shutil.which("python3", path=os.defpath)]
    for candidate in filter(None, candidates):
        probe = subprocess.run(
            [candidate, "-c", "import redis_lease"],
            cwd=tempfile.gettempdir(),
            env=plain_env(),
            capture_output=True,
        )
        if probe.returncode != 0:
            return candidate
    pytest.skip("every python3 here can import redis_lease: no plain interpreter to run")


def plain_env() -> dict[str, str]:
    """The environment of a shell where the venv is not active."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    return env


def test_reservations_example(example_redis: str) -> None:
    before = all_keys(example_redis)
    report = run_example("examples/reservations/run.py", "--url", example_redis, "--json")
    left = {k: ttl for k, ttl in all_keys(example_redis).items() if k not in before}
    # Its keys (prefix seats-<hex>) and its RQ queue (<prefix>-cleanup) are gone; RQ's own
    # locks (e.g. rq:clean_groups) expire by themselves.
    assert [k for k in left if "seats-" in k] == [], left
    assert [k for k, ttl in left.items() if ttl < 0] == [], left
    assert report["ok"] is True
    assert report["state"] == "succeeded"
    assert report["items"] == report["messages"] == report["done"] > 0
    assert report["renewed_holds_released"] == 0
    assert report["seats_in_both_sets"] == 0
    assert report["expired_holds_not_released"] == 0
    outcomes = report["released"] + report["renewed"] + report["already_handled"]
    assert outcomes == report["done"]  # every commit carries one outcome label
    assert report["released"] > 0 and report["renewed"] > 0 and report["already_handled"] > 0


def assert_payments_report(report: dict[str, Any], items: int) -> None:
    """Every item done, and the provider applied each effect exactly once."""
    assert report["state"] == "succeeded", report
    assert report["items"] == report["done"] == items
    assert report["dead"] == report["unfinished"] == 0
    assert report["duplicate_effects"] == 0
    assert report["effects_applied"] == items
    assert report["provider_peak_in_flight"] >= 1


def test_payments_example_with_faults(example_redis: str) -> None:
    report = run_example("examples/payments/run.py", "--url", example_redis, "--items", "300")
    assert_payments_report(report, 300)
    faults = " ".join(report["faults"])
    assert "SIGSTOP" in faults and "SIGKILL" in faults  # resumed only if the run outlasts it
    assert report["lease_takeovers"] >= 1


def test_payments_example_throttled(example_redis: str) -> None:
    report = run_example(
        "examples/payments/run.py",
        "--url",
        example_redis,
        "--throttle",
        "--no-faults",
        "--items",
        "200",
    )
    assert_payments_report(report, 200)
    assert report["faults"] == []
    gate = report["provider_cap"]
    assert gate["throttles"] == report["provider_throttled"] > 0  # each 429 reached the gate
    assert report["provider_peak_in_flight"] <= gate["max_cap"]
    assert gate["peak_granted_in_flight"] <= gate["max_cap"]


def test_payments_example_runs_from_a_plain_python3(example_redis: str) -> None:
    """``python3 examples/payments/run.py`` with the venv not active: it runs itself again
    with the project's .venv instead of failing with ModuleNotFoundError."""
    report = run_example(
        "examples/payments/run.py",
        "--url",
        example_redis,
        "--no-faults",
        "--items",
        "40",
        "--workers",
        "2",
        python=plain_python(),
        env=plain_env(),
    )
    assert_payments_report(report, 40)


def test_an_example_without_a_venv_says_how_to_make_one(tmp_path: Path) -> None:
    """A copy of the example where no .venv exists: one line that says what to run, exit 1."""
    copy = tmp_path / "examples" / "payments" / "run.py"
    copy.parent.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "payments" / "run.py", copy)
    done = subprocess.run(
        [plain_python(), str(copy), "--items", "1"],
        cwd=tmp_path,
        env=plain_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "is not installed for" in done.stderr and "make setup" in done.stderr
