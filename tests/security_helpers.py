"""Helpers of the ACL, TLS and secrets tests: the CLI as a subprocess, and a fleet run driven
through it (2 ``redis-lease worker`` processes, ``start`` and ``tick`` until the run ends)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

from tests.fleet_helpers import REPO, Processes, wait_for

FLEET = "tests.fleet_jobs:fleet"
FINAL = ("succeeded", "partial", "failed", "canceled")


@dataclass
class Cli:
    """``redis-lease`` with global options (``--url`` and TLS files), run as a subprocess.

    Every output it gave is kept in :attr:`outputs` (stdout and stderr).
    """

    url: str
    options: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)

    def args(self, *args: str) -> list[str]:
        """The command line of ``redis-lease ARGS``."""
        return [sys.executable, "-m", "redis_lease", "--url", self.url, *self.options, *args]

    def run(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Runs ``redis-lease ARGS``; its output is kept."""
        done = subprocess.run(
            self.args(*args),
            cwd=REPO,
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        self.outputs += [done.stdout, done.stderr]
        return done

    def ok(self, *args: str) -> str:
        """Runs ``redis-lease ARGS``, asserts exit 0, returns stdout."""
        done = self.run(*args)
        assert done.returncode == 0, f"{args}: exit {done.returncode}: {done.stderr}"
        return done.stdout


def fleet_env(queue: str, items: int = 30) -> dict[str, str]:
    """The fleet job's settings for its worker processes and the CLI."""
    return {"FLEET_QUEUE": queue, "FLEET_ITEMS": str(items), "FLEET_SHARDS": "3", "FLEET_TTL": "5"}


def fleet_run(
    worker_cli: Cli, procs: Processes, queue: str, day: str, *, timeout: float = 90
) -> str:
    """Runs the fleet job's run of ``day`` with 2 forking worker processes; returns its id.

    The run is started and ticked through ``worker_cli`` until it is final; the workers
    are stopped (SIGTERM, a warm shutdown) and waited for.
    """
    workers = [
        procs.start(worker_cli.args("worker", "--queue", queue), worker_cli.env, f"worker-{n}")
        for n in range(2)
    ]
    run_id = str(json.loads(worker_cli.ok("start", FLEET, "--date", day, "--json"))["run"])

    def final() -> str | None:
        worker_cli.ok("tick", FLEET)
        state = str(json.loads(worker_cli.ok("status", run_id, "--json"))["state"])
        return state if state in FINAL else None

    try:
        state = wait_for(final, timeout, f"run {run_id} to end", every=0.3)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.terminate()
        for worker in workers:
            worker.wait(timeout=30)
    assert state == "succeeded", [procs.log(f"worker-{n}") for n in range(2)]
    for n in range(2):
        worker_cli.outputs.append((procs.logs / f"worker-{n}.log").read_text(errors="replace"))
    return run_id
