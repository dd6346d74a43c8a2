"""Helpers of the fleet tests: worker processes, polling, RQ cleanup, job payload checks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Runs
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.fleet.transport import shard_jobs

REPO = Path(__file__).resolve().parent.parent
FLEET_PATH = "tests.fleet_jobs:fleet"
NIGHTLY_PATH = "tests.fleet_jobs:nightly"

T = TypeVar("T")
#: Sets the nightly job's options for one test: ``configure(**options) -> Job``.
Configure = Callable[..., Job]


def wait_for(check: Callable[[], T | None], timeout: float, what: str, every: float = 0.05) -> T:
    """Polls ``check`` until it returns something truthy; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def text(value: Any) -> str:
    """Bytes or text as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def pid_alive(pid: int) -> bool:
    """True while a process exists and is not a zombie (read from /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def group_stopped(pgid: int) -> bool:
    """True once every thread of every process in group ``pgid`` is stopped (state T or t
    in /proc/<pid>/task/<tid>/stat): a SIGSTOP has taken effect everywhere."""
    seen = False
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid or fields[0] == "Z":
                continue
            seen = True
            if not threads_stopped(int(entry.name)):
                return False
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
    return seen


def threads_stopped(pid: int) -> bool:
    """True once every thread of process ``pid`` is stopped (T or t), or it is gone."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:  # the process is gone
        return True
    for task in tasks:
        try:
            state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # the thread ended meanwhile
            continue
        if state not in ("T", "t"):
            return False
    return True


def stop_group(pgid: int, timeout: float = 10.0) -> None:
    """SIGSTOPs process group ``pgid`` and waits until all its threads are stopped."""
    os.killpg(pgid, signal.SIGSTOP)
    wait_for(lambda: group_stopped(pgid), timeout, f"process group {pgid} to stop", every=0.005)


def processes_mentioning(needle: str) -> list[int]:
    """Process ids whose command line contains ``needle`` (a /proc scan, no psutil)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if needle in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def children_of(pid: int) -> list[tuple[int, str]]:
    """Live direct children of ``pid`` with their command lines."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append((int(entry.name), cmdline))
    return found


@dataclass
class Processes:
    """Processes a test started; :meth:`kill_all` leaves none behind."""

    logs: Path
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)
    extra_pids: set[int] = field(default_factory=set)

    def start(self, args: list[str], env: dict[str, str], name: str) -> subprocess.Popen[bytes]:
        """Starts ``args`` in its own session, in the repository, logging to ``name``.log."""
        log = (self.logs / f"{name}.log").open("wb")
        process = subprocess.Popen(
            args,
            cwd=REPO,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.started.append(process)
        return process

    def worker(
        self,
        url: str,
        queue: str,
        env: dict[str, str],
        *,
        simple: bool = True,
        name: str = "w",
        queue_url: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Starts ``redis-lease worker`` on ``queue`` (``--simple`` unless told otherwise),
        with RQ on ``queue_url`` when given."""
        urls = ["--url", url, *(["--queue-url", queue_url] if queue_url else [])]
        args = [sys.executable, "-m", "redis_lease", *urls, "worker", "--queue", queue]
        return self.start([*args, "--simple"] if simple else args, env, name)

    def log(self, name: str) -> str:
        """The output of process ``name`` so far (for failure messages)."""
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def kill_all(self) -> None:
        """SIGKILL to every process group started and every extra pid; waits for each."""
        for process in self.started:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        for pid in self.extra_pids:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        for process in self.started:
            process.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(pid_alive(pid) for pid in self.extra_pids) and time.monotonic() < deadline:
            time.sleep(0.05)


def fleet_env(queue: str, **settings: Any) -> dict[str, str]:
    """Environment for worker processes of the fleet job: ``FLEET_<NAME>`` variables."""
    env = {"FLEET_QUEUE": queue}
    env.update({f"FLEET_{name.upper()}": str(value) for name, value in settings.items()})
    return env


def drive(store: LeaseStore, path: str, run_id: str, timeout: float) -> str:
    """Ticks (as the scheduler would) until the run is final; returns its state."""
    runs = Runs(store)

    def final() -> str | None:
        tick(store, [path])
        state = runs.info(run_id)["state"]
        return state if state in FINAL_STATES else None

    return wait_for(final, timeout, f"run {run_id} to finish", every=0.2)


def owner_pid(owner: str | None) -> int | None:
    """The process id in a lease owner name (``host:pid:job``)."""
    parts = (owner or "").split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


def leased_by(store: LeaseStore, run_id: str) -> dict[str, int]:
    """Leased items of the run and the pid of their holder."""
    held = {}
    for shard in range(store.shard_count(run_id)):
        for record in store.items(run_id, shard):
            pid = owner_pid(record.owner)
            if record.state == "leased" and pid is not None:
                held[record.item_id] = pid
    return held


def all_records(store: LeaseStore, run_id: str) -> Iterator[Any]:
    """Every item record of the run."""
    for shard in range(store.shard_count(run_id)):
        yield from store.items(run_id, shard)


def job_data(client: redis.Redis, rq_id: str) -> bytes:
    """The raw ``data`` field of an RQ job hash, decompressed when RQ compressed it."""
    raw = client.hget(f"rq:job:{rq_id}", "data")
    assert raw is not None, f"rq:job:{rq_id} has no data field"
    try:
        return zlib.decompress(raw)
    except zlib.error:
        return bytes(raw)


def assert_json_job(client: redis.Redis, rq_id: str) -> Any:
    """Asserts the RQ job's payload is JSON, not a pickle; returns it decoded."""
    raw = client.hget(f"rq:job:{rq_id}", "data")
    assert raw is not None, f"rq:job:{rq_id} has no data field"
    assert not bytes(raw).startswith(b"\x80"), f"{rq_id}: stored data is a pickle"
    data = job_data(client, rq_id)
    assert not data.startswith(b"\x80"), f"{rq_id}: data is a pickle"
    return json.loads(data)


def purge_queue(client: redis.Redis, name: str, extra_job_ids: tuple[str, ...] = ()) -> None:
    """Deletes an RQ queue of this test: its jobs in every registry, its workers, its keys."""
    shard_jobs.purge_queue(client, name, extra_job_ids)


def configure_nightly(
    store: LeaseStore, monkeypatch: pytest.MonkeyPatch, items: int
) -> Iterator[Configure]:
    """The nightly job (tests.fleet_jobs) on an RQ queue of the test's own, planning ``items``
    items with no failures (a generator for a fixture: purges the queue afterwards)."""
    from tests import fleet_jobs  # the jobs module imports the worker; only fixtures need it

    name = f"{store.prefix}-q"
    for key, value in {"items": items, "fail_after": None, "crash_after": None}.items():
        monkeypatch.setitem(fleet_jobs.PLAN, key, value)

    def configure(**options: Any) -> Job:
        job = fleet_jobs.nightly
        monkeypatch.setattr(job, "options", replace(job.options, queue=name, **options))
        return job

    configure()
    yield configure
    purge_queue(store.client, name)
