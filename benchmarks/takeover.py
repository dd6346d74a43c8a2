"""How long a worker's work waits after the worker dies: redis-lease against BullMQ.

Each round, for each system (interleaved: A B, then B A), on one private
``redis-server``: 800 items, a 20 ms handler, 2 worker processes at the system's
defaults (redis-lease: ``redis-lease worker``, forking, concurrency 1, lease 60 s,
heartbeat every 1 s, dead after 5 s; BullMQ 6: ``Worker`` with concurrency 1, lock 30 s,
stalled check every 30 s). Once a quarter of the items are done, the worker that holds
work is SIGKILLed (redis-lease: the worker and its work horse, as an OOM kill or a power
cut takes both). Figures per round:

- ``held``: the items the killed worker held (leased, or BullMQ's active job);
- ``back_s``: seconds from the SIGKILL until the last of them was claimed again;
- ``done_s``: seconds from the SIGKILL until the last of them was done (the figure the
  goal is about: at most a third of BullMQ's).

The survivor goes on with the other items meanwhile. Medians over the rounds, the ratio
redis-lease / BullMQ, and the load average go to stdout (``--json``: one object).

Usage::

    python benchmarks/takeover.py [--rounds 5] [--items 800] [--sleep-ms 20] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import date
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "benchmarks" / "peer_apps"
for path in (ROOT, PEERS_DIR):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

import takeover_jobs  # type: ignore[import-not-found]  # noqa: E402

from benchmarks.bench_fleet import Fleet, log, machine, redis_for, worker_env  # noqa: E402
from benchmarks.peers import NODE_DIR, setup_bullmq  # noqa: E402
from redis_lease.fleet.runs.lifecycle import Runs  # noqa: E402
from redis_lease.fleet.transport.shard_jobs import enqueue_shard, purge_queue  # noqa: E402
from redis_lease.fleet.transport.takeover import registered  # noqa: E402
from redis_lease.protocol.leases import read_items  # noqa: E402
from redis_lease.protocol.store.lease_store import LeaseStore  # noqa: E402

WORKERS = 2
SHARDS = 8
KILL_AT = 0.25
ROUND_TIMEOUT = 240.0
POLL = 0.02
BULLMQ_WORKER = PEERS_DIR / "bullmq" / "takeover_worker.mjs"
_LOAD_AT_START = os.getloadavg()


@dataclass
class Round:
    """One kill: what the killed worker held and how long its items waited."""

    system: str
    held: int
    back_s: float
    done_s: float


def now_ms() -> int:
    """This machine's clock in ms (Redis runs on it too: its TIME is the same clock)."""
    return int(time.time() * 1000)


def wait_for(what: str, check: Callable[[], bool], timeout: float = ROUND_TIMEOUT) -> None:
    """Polls ``check`` until it holds; raises after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(POLL)


class Bench:
    """The rounds, on one Redis, with the workers' logs in one folder."""

    def __init__(self, url: str, folder: Path, items: int, sleep_ms: float) -> None:
        self.url, self.folder, self.items, self.sleep_ms = url, folder, items, sleep_ms
        self.client = redis.Redis.from_url(url)
        self.rounds_made = 0

    def fleet(self, commands: list[list[str]], env: dict[str, str], label: str) -> Fleet:
        folder = self.folder / label
        folder.mkdir(exist_ok=True)
        fleet = Fleet(commands, env, folder)
        fleet.start()
        return fleet

    # -- redis-lease ------------------------------------------------------------

    def lease(self) -> Round:
        """A run worked by 2 ``redis-lease worker`` processes; one is killed with its horse."""
        self.rounds_made += 1
        queue = f"takeover-lease-{self.rounds_made}"
        store = LeaseStore(self.client, prefix=queue, url=self.url)
        runs = Runs(store)
        env = {
            takeover_jobs.QUEUE_ENV: queue,
            takeover_jobs.ITEMS_ENV: str(self.items),
            takeover_jobs.SLEEP_MS_ENV: str(self.sleep_ms),
        }
        os.environ[takeover_jobs.ITEMS_ENV] = str(self.items)  # read by the planner
        job = takeover_jobs.make_job(queue)
        run_id, _ = runs.ensure(
            job, date.fromordinal(730_000 + self.rounds_made), runs.server_now()
        )
        runs.plan(job, run_id)
        for shard in range(SHARDS):
            enqueue_shard(store, takeover_jobs.JOB_PATH, queue, run_id, shard, 300)
        base = [sys.executable, "-m", "redis_lease", "--url", self.url, "--prefix", queue]
        names = [f"{queue}-w{n}" for n in range(WORKERS)]
        commands = [[*base, "worker", "--queue", queue, "--name", name] for name in names]
        worker_environment = worker_env(env, self.folder / "pycache")
        worker_environment["PYTHONPATH"] += os.pathsep + str(PEERS_DIR)
        fleet = self.fleet(commands, worker_environment, queue)
        try:
            return self._kill_lease_worker(store, run_id, fleet, names)
        finally:
            for process in fleet.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            fleet.wait(30)
            purge_queue(self.client, queue)
            for key in self.client.scan_iter(match=f"{queue}:*", count=1000):
                self.client.delete(key)

    def _kill_lease_worker(
        self, store: LeaseStore, run_id: str, fleet: Fleet, names: list[str]
    ) -> Round:
        def done() -> int:
            return store.status(run_id).counts["done"]

        wait_for("a quarter of the items", lambda: done() >= self.items * KILL_AT)
        victim: dict[str, Any] = {}

        def holding() -> bool:
            for entry in registered(store):
                if (
                    entry.job
                    and entry.beat
                    and entry.beat.get("held")
                    and entry.job.worker in names
                ):
                    victim.update(worker=entry.job.worker, pid=entry.job.pid, owner=entry.job.owner)
                    return True
            return False

        wait_for("a worker holding leases", holding)
        main = fleet.processes[names.index(victim["worker"])]
        killed_at = now_ms()
        for pid in (victim["pid"], main.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        records = self._records(store, run_id)
        held = [
            i
            for i, r in records.items()
            if r.get("state") == "leased" and r.get("owner") == victim["owner"]
        ]
        if not held:
            raise RuntimeError("the killed worker held no lease at the kill")

        def finished() -> bool:
            now = self._records(store, run_id)
            return all(now[i].get("state") in ("done", "dead") for i in held)

        wait_for("the killed worker's items", finished)
        final = self._records(store, run_id)
        back = max(final[i]["leased_at"] for i in held) - killed_at
        last = max(final[i].get("done_at", 0) for i in held) - killed_at
        wait_for("the whole run", lambda: done() == self.items)
        return Round("redis_lease", len(held), back / 1000, last / 1000)

    def _records(self, store: LeaseStore, run_id: str) -> dict[str, dict[str, Any]]:
        records: dict[str, dict[str, Any]] = {}
        for shard in range(SHARDS):
            records.update(read_items(self.client.hgetall(store.keys.shard(run_id, shard)[2])))
        return records

    # -- BullMQ -----------------------------------------------------------------

    def bullmq(self) -> Round:
        """800 BullMQ jobs worked by 2 Node.js workers; the one with an active job is killed."""
        self.rounds_made += 1
        queue = f"takeover-bull-{self.rounds_made}"
        host, port = (
            self.client.connection_pool.connection_kwargs["host"],
            self.client.connection_pool.connection_kwargs["port"],
        )
        produced = subprocess.run(
            [
                "node",
                str(NODE_DIR / "producer.mjs"),
                queue,
                queue,
                host,
                str(port),
                str(self.items),
            ],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
        )
        log(f"bullmq: {produced.stdout.strip()}")
        commands = [
            [
                "node",
                str(NODE_DIR / "takeover_worker.mjs"),
                queue,
                queue,
                host,
                str(port),
                str(self.sleep_ms),
            ]
            for _ in range(WORKERS)
        ]
        fleet = self.fleet(commands, dict(os.environ), queue)
        started, finished = f"{queue}:bench:started", f"{queue}:bench:done"
        try:
            wait_for(
                "a quarter of the jobs", lambda: self.client.hlen(finished) >= self.items * KILL_AT
            )
            pids = [p.pid for p in fleet.processes]
            victim: list[int] = []

            def busy() -> bool:  # a worker whose active job is not done yet
                active = [j.decode() for j in self.client.lrange(f"{queue}:{queue}:active", 0, -1)]
                for job in active:
                    pid = self.client.hget(started, job)
                    if pid and int(pid) in pids and not self.client.hexists(finished, job):
                        victim.append(int(pid))
                        return True
                return False

            wait_for("a busy worker", busy)
            killed_at = now_ms()
            os.kill(victim[0], signal.SIGKILL)
            active = [j.decode() for j in self.client.lrange(f"{queue}:{queue}:active", 0, -1)]
            held = [j for j in active if int(self.client.hget(started, j) or 0) == victim[0]]
            if not held:
                raise RuntimeError("the killed worker held no active job")

            def redone(job: str) -> int:
                return int(self.client.hget(finished, job) or 0)

            wait_for("the killed worker's job", lambda: all(redone(j) > killed_at for j in held))
            back = max(int(self.client.hget(f"{started}:at", job) or 0) for job in held) - killed_at
            last = max(redone(job) for job in held) - killed_at
            wait_for("every job", lambda: self.client.hlen(finished) >= self.items)
            return Round("bullmq", len(held), back / 1000, last / 1000)
        finally:
            for process in fleet.processes:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            fleet.wait(30)
            for key in self.client.scan_iter(match=f"{queue}:*", count=1000):
                self.client.delete(key)


def summary(rounds: list[Round]) -> dict[str, Any]:
    """Medians per system and the ratios redis-lease / BullMQ."""
    by: dict[str, dict[str, float]] = {}
    for system in ("redis_lease", "bullmq"):
        mine = [r for r in rounds if r.system == system]
        if mine:
            by[system] = {
                "held": statistics.median(r.held for r in mine),
                "back_s": round(statistics.median(r.back_s for r in mine), 2),
                "done_s": round(statistics.median(r.done_s for r in mine), 2),
            }
    ratios = {}
    if len(by) == 2:
        for figure in ("back_s", "done_s"):
            ratios[figure] = round(by["redis_lease"][figure] / by["bullmq"][figure], 3)
    return {"medians": by, "ratios": ratios}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--items", type=int, default=800)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--systems", default="redis_lease,bullmq")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    systems = args.systems.split(",")
    if "bullmq" in systems:
        why = setup_bullmq()
        if why:
            raise SystemExit(f"bullmq: {why}")
        (NODE_DIR / "takeover_worker.mjs").write_bytes(BULLMQ_WORKER.read_bytes())
    rounds: list[Round] = []
    with (
        tempfile.TemporaryDirectory(prefix="takeover-") as tmp,
        redis_for(None, Path(tmp)) as (url, kind),
    ):
        bench = Bench(url, Path(tmp), args.items, args.sleep_ms)
        log(f"Redis: {kind}")
        for number in range(args.rounds):
            order = systems if number % 2 == 0 else systems[::-1]
            for system in order:
                measured = bench.lease() if system == "redis_lease" else bench.bullmq()
                rounds.append(measured)
                log(f"round {number + 1} {system}: {asdict(measured)}")
        report = {
            **summary(rounds),
            "rounds": [asdict(r) for r in rounds],
            "items": args.items,
            "sleep_ms": args.sleep_ms,
            "load_average": {"start": _LOAD_AT_START, "end": os.getloadavg()},
            "machine": machine(bench.client),
        }
    if args.json:
        print(json.dumps(report))
    else:
        print(json.dumps({k: report[k] for k in ("medians", "ratios", "load_average")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
