"""The processes of a burst run: its private ``redis-server`` and the consumers of a trial.

The server and the process handling are ``benchmarks/bench_fleet.py``'s; the consumers
run in their own session, so that Ctrl-C reaches only the benchmark, which stops them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from benchmarks.bench_fleet import ROOT, Fleet, redis_for
from benchmarks.burst_jobs import Settings

#: Seconds the consumers of a trial get to start and register with RQ.
START_TIMEOUT = 60.0
#: Seconds a consumer gets to drain and exit after SIGTERM before it is killed.
STOP_TIMEOUT = 20.0


@contextmanager
def private_redis(folder: Path) -> Iterator[str]:
    """A redis-server of this benchmark on a free loopback port; yields its URL.

    Raises RuntimeError when no ``redis-server`` is installed: the benchmark never
    falls back to a shared server.
    """
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed: apt-get install redis-server")
    with redis_for(None, folder) as (url, _):
        yield url


@dataclass
class Consumers:
    """The ``redis-lease worker --simple`` processes of one trial."""

    url: str
    prefix: str
    settings: Settings
    folder: Path
    fleet: Fleet = field(init=False)

    def __post_init__(self) -> None:
        env = {**os.environ, **self.settings.to_env()}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        env.pop("REDIS_LEASE_URL", None)
        self.fleet = Fleet([], env, self.folder)

    @property
    def processes(self) -> list[subprocess.Popen[bytes]]:
        """The consumers started so far."""
        return self.fleet.processes

    def start(self, count: int) -> None:
        """Starts ``count`` workers on the trial's queue (each in its own session)."""
        queue = self.settings.queue
        for number in range(count):
            name = f"{queue}-{number}"
            command = [sys.executable, "-m", "redis_lease", "--url", self.url]
            command += ["--prefix", self.prefix, "worker", "--simple", "--queue", queue]
            command += ["--name", name]
            self.fleet.commands.append(command)
            with (self.folder / f"{name}.log").open("wb") as out:
                self.processes.append(
                    subprocess.Popen(
                        command,
                        cwd=ROOT,
                        env=self.fleet.env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )

    def wait_registered(self, client: redis.Redis) -> None:
        """Waits until every worker has registered with RQ on the trial's queue."""
        key = f"rq:workers:{self.settings.queue}"
        deadline = time.monotonic() + START_TIMEOUT
        while client.scard(key) < len(self.processes):
            exited = [p.returncode for p in self.processes if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise RuntimeError(
                    f"{client.scard(key)} of {len(self.processes)} consumers registered "
                    f"(exit codes {exited})\n{self.fleet.output()}"
                )
            time.sleep(0.05)

    def drain_one(self) -> None:
        """SIGTERM to the first consumer: it finishes its item, releases the rest, exits."""
        self.processes[0].send_signal(signal.SIGTERM)

    def stop(self) -> list[int]:
        """SIGTERM to every consumer still running, SIGKILL after STOP_TIMEOUT; exit codes."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        return self.fleet.wait(STOP_TIMEOUT)
