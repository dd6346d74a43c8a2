"""The examples' commands work end to end and their reports say nothing was lost or doubled.

Each command runs as a subprocess against a private redis-server of this module:
the examples start RQ workers on queues of their own naming, and a private
server keeps every key they leave out of the shared Redis.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


def run_example(*args: str, timeout: float = 180) -> dict[str, Any]:
    """Runs an example script; returns its JSON report (it must exit 0)."""
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_reservations_example(example_redis: str) -> None:
    report = run_example("examples/reservations/run.py", "--url", example_redis, "--json")
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
