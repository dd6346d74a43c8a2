"""``redis-lease demo --json`` as a user runs it: on the real Redis and on the embedded
backend, with its faults, leaving no worker processes (and, on a given Redis, no keys).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import pytest
import redis

from redis_lease.demo.runner import demo_deadline
from tests.fleet_helpers import REPO, children_of, pid_alive, processes_mentioning, purge_queue
from tests.redis_cluster import ClusterServers

pytestmark = pytest.mark.slow

QUEUE = re.compile(r"--queue (demo-[0-9a-f]+-shards)")


def run_demo(
    args: list[str], timeout: float, env: dict[str, str] | None = None
) -> tuple[dict[str, Any], set[str], set[int]]:
    """Runs the demo; returns its report and its workers' queues and pids.

    ``timeout`` only keeps a hung demo from hanging the suite: the demo's run has a
    deadline of its own on the server clock (see :func:`assert_clean_report`).
    """
    command = [sys.executable, "-m", "redis_lease", *args]
    started = time.monotonic()
    queues: set[str] = set()
    workers: set[int] = set()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        demo = subprocess.Popen(
            command, cwd=REPO, stdout=out, stderr=err, env={**os.environ, **(env or {})}
        )
        try:
            while demo.poll() is None:  # watch its children while it runs
                for pid, cmdline in children_of(demo.pid):
                    match = QUEUE.search(cmdline)
                    if match and " worker " in cmdline:
                        queues.add(match.group(1))
                        workers.add(pid)
                if time.monotonic() - started > timeout:
                    raise AssertionError(f"demo still running after {timeout}s: hung")
                time.sleep(0.1)
        finally:
            if demo.poll() is None:
                demo.kill()
                demo.wait(timeout=10)
            for pid in workers:  # only if the demo failed to stop them itself
                if pid_alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
        out.seek(0)
        err.seek(0)
        output, errors = out.read(), err.read()
    assert demo.returncode == 0, errors.decode(errors="replace")[-3000:]
    return json.loads(output), queues, workers


def assert_clean_report(report: dict[str, Any]) -> None:
    """The demo's promises: all done, nothing applied twice, the faults were refused.

    The run ended because no item was left, before its deadline closed it.
    """
    assert re.fullmatch(r"payment-reconciliation:\d{4}-\d\d-\d\d", report["run_id"])
    assert report["state"] == "succeeded", report
    assert report["reason"].startswith("no item left to work: "), report["reason"]
    assert report["items"] == report["done"]
    # The figures are the ones the run was judged on: they agree with its reason line.
    assert f"{report['done']} done of {report['items']} planned" in report["reason"]
    assert report["unfinished"] == 0
    assert report["duplicate_effects"] == 0
    # The paused worker's lease was taken over (below) and nothing was paid twice (above).
    # How many of its late writes were refused is reported, not asserted: its leases also
    # run out by its own clock, so once resumed it usually stops before sending any, and
    # the run may even end before it is resumed (both seen under the full suite's load).
    assert report["lease_takeovers"] >= 1, report


def assert_no_workers_left(queues: set[str], workers: set[int]) -> None:
    """Every worker process of the demo has ended."""
    assert len(queues) == 1, queues
    assert workers, "the demo's workers were seen"
    (queue,) = queues
    assert processes_mentioning(queue) == []
    assert [pid for pid in workers if pid_alive(pid)] == []


def test_demo_on_real_redis_default_size(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    queues: set[str] = set()
    try:
        report, queues, workers = run_demo(["--url", redis_url, "demo", "--json"], 120)
        assert report["items"] == 2000
        assert_clean_report(report)
        assert report["deadline"] == demo_deadline(2000, embedded=False) == "70s"
        assert report["backend"].startswith("Redis at")
        assert_no_workers_left(queues, workers)
        (queue,) = queues
        prefix = queue.removesuffix("-shards")
        assert list(client.scan_iter(match=f"{prefix}:*", count=1000)) == []
    finally:
        for queue in queues:
            purge_queue(client, queue)
        client.close()


def test_demo_on_the_embedded_backend(redis_url: str) -> None:
    """``--backend embedded`` wins over a REDIS_URL set for an application: nothing is
    written to that server."""
    client = redis.Redis.from_url(redis_url)
    report, queues, workers = run_demo(
        ["demo", "--json", "--backend", "embedded", "--items", "600"],
        120,
        env={"REDIS_URL": redis_url, "REDIS_LEASE_URL": ""},
    )
    (queue,) = queues
    prefix = queue.removesuffix("-shards")
    assert list(client.scan_iter(match=f"{prefix}:*", count=1000)) == []
    assert list(client.scan_iter(match=f"rq:*{prefix}*", count=1000)) == []
    client.close()
    assert report["items"] == 600
    assert_clean_report(report)
    assert report["deadline"] == demo_deadline(600, embedded=True) == "60s"
    assert report["backend"].startswith("embedded fakeredis")
    assert_no_workers_left(queues, workers)


def test_a_url_on_the_line_and_an_explicit_backend_are_refused(redis_url: str) -> None:
    """Two named servers: one line, exit 2, before anything starts."""
    command = [sys.executable, "-m", "redis_lease", "--url", redis_url, "demo", "--backend"]
    done = subprocess.run([*command, "embedded"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    assert done.stderr == (
        "error: --url and --backend embedded name two Redis servers: give one of them\n"
    )
    assert done.stdout == ""


def test_demo_on_a_redis_cluster(redis_cluster: ClusterServers, redis_url: str) -> None:
    """The lease state on the 3-primary cluster, RQ's queue on the plain Redis."""
    urls = ["--url", redis_cluster.url, "--queue-url", redis_url]
    client = redis.Redis.from_url(redis_url)
    cluster = redis_cluster.client()
    queues: set[str] = set()
    try:
        report, queues, workers = run_demo([*urls, "demo", "--json", "--items", "600"], 120)
        assert report["items"] == 600
        assert_clean_report(report)
        assert report["backend"].startswith("Redis at redis+cluster://")
        assert_no_workers_left(queues, workers)
        (queue,) = queues
        prefix = queue.removesuffix("-shards")
        assert list(cluster.scan_iter(match=f"{prefix}:*", count=1000)) == []
    finally:
        for queue in queues:
            purge_queue(client, queue)
        client.close()
        cluster.close()
