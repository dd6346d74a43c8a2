"""redis-lease side by side with its peers: BullMQ, RQ and Celery, and a redis-py Lock.

One harness for all: the same private ``redis-server`` (started on a free loopback
port with ``--save '' --appendonly no``, stopped at the end), the same machine, 2
worker processes per peer, a warm-up run per peer that is not reported, then
rounds in which every peer runs once (A B A B ...), and the median of the rounds.
Three handlers: a no-op, a 1 ms and a 20 ms sleep. Per peer and handler (and
``ratios``: redis-lease / peer for each, so above 1 is more items/s for redis-lease
and below 1 is less server CPU or fewer commands per item):

- ``items_per_s``: items finished per second in the consume phase, which runs from
  the first poll that sees an item finished (worker start-up left out) to the poll
  that sees every item finished;
- ``server_us_per_item``: the delta of ``used_cpu_user + used_cpu_sys`` (``INFO
  cpu``) over the consume phase / its items;
- ``commands_per_item``: the delta of the sum of ``calls`` in ``INFO commandstats``
  (commands run inside scripts included) over the consume phase / its items.

The harness's own polling is measured before the workers start (a few polls
between two INFO calls) and subtracted from both; so is its one INFO inside the
phase and, for Celery, the one INCR per task that tells it a task finished.

Peers (2 worker processes each):

- ``redis_lease``: a run planned with ``Runs.ensure`` + ``Runs.plan`` over 8 shards,
  worked by ``redis-lease worker --simple --burst``. The sleeping handlers are
  ``async`` with 16 items in flight per worker where redis-lease supports it
  (``JobOptions.concurrency``); otherwise a plain ``time.sleep`` one item at a time.
- ``bullmq``: Node.js workers with concurrency 16, jobs added with ``addBulk`` and
  ``removeOnComplete: true`` (a production queue does not keep every finished job).
- ``rq_simple`` / ``rq_fork``: one RQ job per item (JSON serializer), ``SimpleWorker``
  / the forking ``Worker``; the handler is ``time.sleep`` (no overlap).
- ``celery``: Redis broker, ``acks_late=True``, no result backend, ``--pool threads
  --concurrency 16``, gossip, mingle and heartbeat off.

``redis_lease_c32``: one more redis-lease run in the rotation, the 20 ms handler at
concurrency 32 (2 processes), with its share of the ideal 2 x 32 / 20 ms and its
items/s ratio against RQ SimpleWorker's 20 ms figure (the comparisons with BullMQ and
Celery stay at concurrency 16).

``redis_lease_cycle_vs_lock``: one ``store.claim`` + ``store.commit`` cycle against
one redis-py ``Lock`` acquire + release cycle, one connection, blocks interleaved.

Usage::

    python benchmarks/peers.py [--quick] [--json] [--peers redis_lease,bullmq,...]
                               [--handlers noop,1ms,20ms] [--rounds N]

``--quick`` takes a few minutes; the full mode runs more items and more rounds.
Progress goes to stderr; ``--json`` prints one JSON object on stdout. BullMQ and
ioredis are installed with ``npm ci`` into ``benchmarks/.peers/node`` (versions
pinned in ``benchmarks/peer_apps/bullmq/package-lock.json``); a peer that cannot run
here (no Node.js, no npm registry, no Celery) is reported as null with the reason.
The medians, ratios, figures and the report are built in ``peers_report.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis
from rq import Queue
from rq.serializers import JSONSerializer

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "benchmarks" / "peer_apps"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(PEERS_DIR) not in sys.path:
    sys.path.insert(0, str(PEERS_DIR))

import peer_lease_jobs  # type: ignore[import-not-found]  # noqa: E402
import peer_rq_tasks  # type: ignore[import-not-found]  # noqa: E402

from benchmarks.bench_fleet import Fleet, log, machine, redis_for, worker_env  # noqa: E402
from benchmarks.peers_report import (  # noqa: E402
    FigureMap,
    Round,
    build_report,
    concurrency_run,
    median,
    ratio,
    summarize,
    table,
)
from redis_lease.fleet.jobs.job import JobOptions  # noqa: E402
from redis_lease.fleet.runs.lifecycle import Runs  # noqa: E402
from redis_lease.fleet.transport.shard_jobs import enqueue_shard  # noqa: E402
from redis_lease.protocol.leases import Item  # noqa: E402
from redis_lease.protocol.store.lease_store import LeaseStore  # noqa: E402

BULLMQ_DIR = PEERS_DIR / "bullmq"
NODE_DIR = ROOT / "benchmarks" / ".peers" / "node"
NODE_FILES = ("package.json", "package-lock.json", "worker.mjs", "producer.mjs")

PEERS = ("redis_lease", "bullmq", "rq_simple", "rq_fork", "celery")
HANDLERS: dict[str, float] = {"noop": 0.0, "1ms": 1.0, "20ms": 20.0}
WORKERS = 2
CONCURRENCY = 16
#: The extra redis-lease run: this handler at this concurrency, reported on its own.
C32 = "redis_lease_c32"
C32_CONCURRENCY = 32
C32_HANDLER = "20ms"
#: What --peers can name: the peers, and the extra redis-lease run.
RUNS = (*PEERS, C32)
SHARDS = 8
#: The job's default: claims sized to the handler, at most this many a call.
BATCH = JobOptions().batch_size
POLL_SECONDS = 0.01
CALIBRATION_POLLS = 10
ENQUEUE_BLOCK = 500
WARMUP_ITEMS = 100

#: Items per run, by mode, handler and peer. The peers that run one item at a time
#: per process (RQ) get few items with the 20 ms handler: RQ does about 50 of those
#: a second per process, and forking RQ about 40 of any.
ITEMS: dict[str, dict[str, dict[str, int]]] = {
    "quick": {
        "noop": dict(redis_lease=6000, bullmq=4000, rq_simple=1000, rq_fork=150, celery=1500),
        "1ms": dict(redis_lease=5000, bullmq=4000, rq_simple=600, rq_fork=150, celery=1500),
        "20ms": dict(
            redis_lease=1500, bullmq=1500, rq_simple=150, rq_fork=80, celery=1500, **{C32: 3000}
        ),
    },
    "full": {
        "noop": dict(redis_lease=20000, bullmq=15000, rq_simple=3000, rq_fork=400, celery=6000),
        "1ms": dict(redis_lease=15000, bullmq=15000, rq_simple=2000, rq_fork=400, celery=6000),
        "20ms": dict(
            redis_lease=6000, bullmq=6000, rq_simple=400, rq_fork=200, celery=4000, **{C32: 12000}
        ),
    },
}
#: redis-lease items when its handler cannot overlap sleeps (no concurrency support).
SEQUENTIAL_LEASE_ITEMS = {"quick": {"1ms": 1000, "20ms": 200}, "full": {"1ms": 4000, "20ms": 800}}
ROUNDS = {"quick": 3, "full": 5}
#: Claim + commit against Lock cycles: cycles per block, blocks per round.
CYCLE_BLOCK = 200
CYCLE_BLOCKS = {"quick": 5, "full": 20}
CYCLE_ROUNDS = {"quick": 3, "full": 5}
RUN_TIMEOUT = 240.0

_LOAD_AT_START = os.getloadavg()


# -- server counters ----------------------------------------------------------


@dataclass
class Snapshot:
    """The server's CPU seconds and command calls (by command) at one moment."""

    cpu: float
    calls: dict[str, int]

    @property
    def total(self) -> int:
        """Every command call so far."""
        return sum(self.calls.values())


def snapshot(client: redis.Redis) -> Snapshot:
    """One ``INFO cpu commandstats``."""
    info = client.info("cpu", "commandstats")
    calls = {
        key.removeprefix("cmdstat_"): int(value["calls"])
        for key, value in info.items()
        if key.startswith("cmdstat_")
    }
    return Snapshot(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]), calls)


@dataclass
class PollCost:
    """What one harness poll costs the server (subtracted from the phase)."""

    calls: dict[str, float]
    cpu: float
    info_cpu: float

    @property
    def commands(self) -> float:
        """Commands per poll."""
        return sum(self.calls.values())


def calibrate(client: redis.Redis, progress: Callable[[], tuple[int, int]]) -> PollCost:
    """Measures one poll: polls between two INFO calls, less the cost of an INFO alone."""
    first = snapshot(client)
    second = snapshot(client)
    for _ in range(CALIBRATION_POLLS):
        progress()
    third = snapshot(client)
    info_cpu = max(0.0, second.cpu - first.cpu)
    calls = peer_calls(second, third, {}, 0)
    cpu = max(0.0, third.cpu - second.cpu - info_cpu) / CALIBRATION_POLLS
    return PollCost({n: c / CALIBRATION_POLLS for n, c in calls.items()}, cpu, info_cpu)


def peer_calls(
    before: Snapshot, after: Snapshot, poll_calls: dict[str, float], polls: int
) -> dict[str, float]:
    """Calls of each command between two snapshots, less the harness's own.

    The harness's own: the INFO of ``before`` (counted once it has run) and
    ``polls`` polls of ``poll_calls`` each. Commands with no call left are left out.
    """
    calls: dict[str, float] = {}
    for name, count in after.calls.items():
        left = count - before.calls.get(name, 0) - polls * poll_calls.get(name, 0.0)
        left -= 1 if name == "info" else 0
        if left > 1e-9:
            calls[name] = left
    return calls


# -- one peer run -------------------------------------------------------------


@dataclass
class Prepared:
    """A peer's items, enqueued, and the workers that will consume them."""

    fleet: Fleet
    total: int
    progress: Callable[[], tuple[int, int]]
    #: Commands the harness makes the peer run per item (Celery's finished counter).
    harness_calls_per_item: dict[str, int] = field(default_factory=dict)
    #: Workers that never exit by themselves (BullMQ, Celery) are sent SIGTERM.
    terminate: bool = False


def stop_fleet(fleet: Fleet, terminate: bool) -> list[int]:
    """Lets burst workers exit, or terminates long-running ones; their exit codes."""
    if terminate:
        for process in fleet.processes:
            if process.poll() is None:
                process.terminate()
    return fleet.wait(30)


def consume(client: redis.Redis, prepared: Prepared, label: str) -> Round:
    """Starts the workers and measures the phase from the first finished item to the last."""
    poll = calibrate(client, prepared.progress)
    total = prepared.total
    started = time.perf_counter()
    prepared.fleet.start()
    try:
        wait_until(prepared, 1, started, label)
        before = snapshot(client)
        phase_start = time.perf_counter()
        done0, failed0 = prepared.progress()
        failed, polls = failed0, 1
        if done0 + failed0 < total:
            _, failed, more = wait_until(prepared, total, started, label)
            polls += more
        phase_seconds = time.perf_counter() - phase_start
        after = snapshot(client)
    finally:
        codes = stop_fleet(prepared.fleet, prepared.terminate)
    items = total - done0 - failed0
    if items < total // 4:
        raise RuntimeError(
            f"{label}: only {items} of {total} items finished after the first: too few items "
            "to time, raise the item count"
        )
    if any(codes) and not prepared.terminate:
        log(f"{label}: workers exited {codes}")
    calls = peer_calls(before, after, poll.calls, polls)
    for name, per_item in prepared.harness_calls_per_item.items():
        calls[name] = calls.get(name, 0.0) - items * per_item
    cpu = max(0.0, after.cpu - before.cpu - polls * poll.cpu - poll.info_cpu)
    top = sorted(((count, name) for name, count in calls.items()), reverse=True)[:6]
    return Round(
        items=items,
        seconds=phase_seconds,
        cpu_seconds=cpu,
        commands=sum(calls.values()),
        startup_seconds=phase_start - started,
        failed=failed,
        polls=polls,
        poll_commands=poll.commands,
        load_1m=os.getloadavg()[0],
        top_commands={name: round(count / items, 2) for count, name in top if count > 0},
    )


def wait_until(prepared: Prepared, target: int, started: float, label: str) -> tuple[int, int, int]:
    """Polls the peer's progress until ``target`` items ended: (done, failed, polls).

    Raises RuntimeError when the workers exit or RUN_TIMEOUT passes first.
    """
    polls = 0
    while True:
        done, failed = prepared.progress()
        polls += 1
        if done + failed >= target:
            return done, failed, polls
        elapsed = time.perf_counter() - started
        if elapsed > RUN_TIMEOUT or not prepared.fleet.alive():
            done, failed = prepared.progress()
            polls += 1
            if done + failed >= target:
                return done, failed, polls
            why = "timed out" if prepared.fleet.alive() else "exited"
            raise RuntimeError(
                f"{label}: {done + failed} of {prepared.total} finished after {elapsed:.1f}s; "
                f"workers {why}\n{prepared.fleet.output()}"
            )
        time.sleep(POLL_SECONDS)


# -- the peers ----------------------------------------------------------------


@dataclass
class Harness:
    """One benchmark: its private Redis, its runs and where the workers log."""

    url: str
    client: redis.Redis
    folder: Path
    lease_concurrency_flag: bool
    runs_made: int = 0

    @property
    def host_port(self) -> tuple[str, int]:
        """The Redis host and port (for the Node.js workers)."""
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or 6379

    def env(self, extra: dict[str, str]) -> dict[str, str]:
        """The workers' environment: bench_fleet's, with benchmarks/peers importable."""
        env = worker_env(extra, self.folder / "pycache")
        env["PYTHONPATH"] = os.pathsep.join((str(PEERS_DIR), env["PYTHONPATH"]))
        return env

    def fleet(self, commands: list[list[str]], env: dict[str, str], label: str) -> Fleet:
        """Worker processes logging into a folder of their own."""
        folder = self.folder / label.replace(" ", "-")
        folder.mkdir(exist_ok=True)
        return Fleet(commands, env, folder)

    def name(self, peer: str) -> str:
        """A fresh queue (or prefix) name for one run."""
        self.runs_made += 1
        return f"peer-{peer.replace('_', '-')}-{self.runs_made}"

    def prepare(self, peer: str, sleep_ms: float, items: int, label: str) -> Prepared:
        """Enqueues ``items`` items for ``peer`` and sets up its 2 workers."""
        makers: dict[str, Callable[[float, int, str], Prepared]] = {
            "redis_lease": self.lease,
            C32: lambda ms, n, lb: self.lease(ms, n, lb, C32_CONCURRENCY),
            "bullmq": self.bullmq,
            "rq_simple": lambda ms, n, lb: self.rq(ms, n, lb, "rq.SimpleWorker"),
            "rq_fork": lambda ms, n, lb: self.rq(ms, n, lb, "rq.Worker"),
            "celery": self.celery,
        }
        return makers[peer](sleep_ms, items, label)

    def lease(
        self, sleep_ms: float, items: int, label: str, concurrency: int = CONCURRENCY
    ) -> Prepared:
        """A planned redis-lease run worked by ``redis-lease worker --simple --burst``,
        ``concurrency`` handlers at once per worker with a sleeping handler (no-op: one)."""
        queue = self.name("lease")
        concurrency = concurrency if sleep_ms > 0 else 1
        job = peer_lease_jobs.make_job(queue, SHARDS, BATCH, sleep_ms, concurrency, items)
        store = LeaseStore(self.client, prefix=queue, url=self.url)
        runs = Runs(store)
        day = date.fromordinal(730_000 + self.runs_made)
        run_id, _ = runs.ensure(job, day, runs.server_now())
        planned = runs.plan(job, run_id)
        if planned != items:
            raise RuntimeError(f"{label}: planned {planned} items, expected {items}")
        for shard in range(SHARDS):
            enqueue_shard(store, peer_lease_jobs.JOB_PATH, queue, run_id, shard, 600)
        base = [sys.executable, "-m", "redis_lease", "--url", self.url, "--prefix", queue]
        flag = ["--concurrency", str(concurrency)] if self.lease_concurrency_flag else []
        commands = [
            [
                *base,
                "worker",
                "--simple",
                "--burst",
                "--queue",
                queue,
                "--name",
                f"{queue}-{n}",
                *flag,
            ]
            for n in range(WORKERS)
        ]
        env = self.env(
            {
                peer_lease_jobs.QUEUE_ENV: queue,
                peer_lease_jobs.SHARDS_ENV: str(SHARDS),
                peer_lease_jobs.BATCH_ENV: str(BATCH),
                peer_lease_jobs.SLEEP_MS_ENV: str(sleep_ms),
                peer_lease_jobs.CONCURRENCY_ENV: str(concurrency),
            }
        )

        def progress() -> tuple[int, int]:
            counts = store.status(run_id).counts
            return counts["done"], counts["dead"]

        return Prepared(self.fleet(commands, env, label), items, progress)

    def rq(self, sleep_ms: float, items: int, label: str, worker_class: str) -> Prepared:
        """One RQ job per item (JSON serializer), worked by ``rq worker --burst``."""
        name = self.name("rq")
        queue = Queue(name, connection=self.client, serializer=JSONSerializer)
        for start in range(0, items, ENQUEUE_BLOCK):
            datas = [
                Queue.prepare_data(
                    peer_rq_tasks.WORK_PATH, args=[sleep_ms], job_id=f"{name}-{n}", timeout=60
                )
                for n in range(start, min(items, start + ENQUEUE_BLOCK))
            ]
            with self.client.pipeline() as pipe:
                queue.enqueue_many(datas, pipeline=pipe)
                pipe.execute()
        if queue.count != items:
            raise RuntimeError(f"{label}: enqueued {queue.count} RQ jobs, expected {items}")
        base = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", self.url]
        base += ["--serializer", "rq.serializers.JSONSerializer", "--worker-class", worker_class]
        base += ["--logging_level", "WARNING"]
        commands = [[*base, "--name", f"{name}-{n}", name] for n in range(WORKERS)]
        finished, failed = queue.finished_job_registry.key, queue.failed_job_registry.key

        def progress() -> tuple[int, int]:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zcard(finished)
                pipe.zcard(failed)
                done, dead = pipe.execute()
            return int(done), int(dead)

        return Prepared(self.fleet(commands, self.env({}), label), items, progress)

    def bullmq(self, sleep_ms: float, items: int, label: str) -> Prepared:
        """BullMQ jobs added with ``addBulk``, worked by 2 Node.js workers, concurrency 16."""
        name = self.name("bullmq")
        host, port = self.host_port
        where = [name, "bull", host, str(port)]
        added = subprocess.run(
            ["node", str(NODE_DIR / "producer.mjs"), *where, str(items)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if added.returncode != 0:
            raise RuntimeError(f"{label}: the BullMQ producer failed: {added.stderr[-1500:]}")
        waiting = json.loads(added.stdout.strip().splitlines()[-1])["waiting"]
        if waiting != items:
            raise RuntimeError(f"{label}: {waiting} BullMQ jobs waiting, expected {items}")
        worker = ["node", str(NODE_DIR / "worker.mjs"), *where, str(CONCURRENCY), str(sleep_ms)]
        keys = {part: f"bull:{name}:{part}" for part in ("wait", "active", "delayed", "failed")}

        def progress() -> tuple[int, int]:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.llen(keys["wait"])
                pipe.llen(keys["active"])
                pipe.zcard(keys["delayed"])
                pipe.zcard(keys["failed"])
                wait, active, delayed, dead = (int(n) for n in pipe.execute())
            return items - wait - active - delayed - dead, dead

        fleet = self.fleet([worker] * WORKERS, self.env({}), label)
        return Prepared(fleet, items, progress, terminate=True)

    def celery(self, sleep_ms: float, items: int, label: str) -> Prepared:
        """Celery tasks on the Redis broker, 2 workers with 16 threads each."""
        import peer_celery_app  # type: ignore[import-not-found]

        name = self.name("celery")
        counter = f"{name}:finished"
        with peer_celery_app.app.producer_or_acquire() as producer:
            for _ in range(items):
                peer_celery_app.app.send_task(
                    peer_celery_app.TASK_NAME, args=[sleep_ms], queue=name, producer=producer
                )
        queued = int(self.client.llen(name))
        if queued != items:
            raise RuntimeError(f"{label}: {queued} Celery tasks queued, expected {items}")
        base = [sys.executable, "-m", "celery", "-A", "peer_celery_app", "worker"]
        base += ["--pool", "threads", "--concurrency", str(CONCURRENCY), "-Q", name]
        base += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        base += ["--loglevel", "WARNING"]
        commands = [[*base, "-n", f"{name}-{n}@%h"] for n in range(WORKERS)]
        env = self.env(
            {
                peer_celery_app.BROKER_ENV: self.url,
                peer_celery_app.QUEUE_ENV: name,
                peer_celery_app.COUNTER_ENV: counter,
            }
        )

        def progress() -> tuple[int, int]:
            return int(self.client.get(counter) or 0), 0

        fleet = self.fleet(commands, env, label)
        return Prepared(fleet, items, progress, {"incrby": 1}, terminate=True)

    def run(self, peer: str, sleep_ms: float, items: int, label: str) -> Round:
        """Prepares, consumes, then empties the private server for the next run."""
        try:
            return consume(self.client, self.prepare(peer, sleep_ms, items, label), label)
        finally:
            # The server is this harness's own (started above): empty it between runs.
            self.client.flushall()

    def cycles(self, mode: str) -> dict[str, Any]:
        """``store.claim`` + ``store.commit`` against redis-py ``Lock`` acquire + release."""
        blocks, rounds = CYCLE_BLOCKS[mode], CYCLE_ROUNDS[mode]
        total = (blocks * rounds + 1) * CYCLE_BLOCK
        store = LeaseStore(self.client, prefix="peer-cycles", url=self.url)
        run_id = "cycles"
        store.add(run_id, (Item(f"i{n:07d}", {"n": n}) for n in range(total)), shards=1)
        names = iter(range(total))

        def lease_block() -> None:
            for _ in range(CYCLE_BLOCK):
                lease = store.claim(run_id, f"i{next(names):07d}", "bench", ttl=60)
                store.commit(lease, None)

        lock_names = iter(range(total))

        def lock_block() -> None:
            for _ in range(CYCLE_BLOCK):
                lock = self.client.lock(f"peer-cycles:lock:{next(lock_names)}", timeout=60)
                if not lock.acquire(blocking=False):
                    raise RuntimeError("a fresh lock was not acquired")
                lock.release()

        lease_block()  # warm-up: scripts loaded, connection open
        lock_block()
        systems = {"lease": lease_block, "lock": lock_block}
        rates: dict[str, list[float]] = {"lease": [], "lock": []}
        cost = {k: {"cpu": 0.0, "commands": 0.0, "cycles": 0} for k in systems}
        for _ in range(rounds):
            seconds = {"lease": 0.0, "lock": 0.0}
            for _ in range(blocks):
                for key, block in systems.items():
                    before = snapshot(self.client)
                    start = time.perf_counter()
                    block()
                    seconds[key] += time.perf_counter() - start
                    after = snapshot(self.client)
                    cost[key]["cpu"] += after.cpu - before.cpu
                    cost[key]["commands"] += after.total - before.total - 1
                    cost[key]["cycles"] += CYCLE_BLOCK
            for key in systems:
                rates[key].append(blocks * CYCLE_BLOCK / seconds[key])
        self.client.flushall()
        lease_rate, lock_rate = median(rates["lease"]), median(rates["lock"])
        per = {k: {m: cost[k][m] / cost[k]["cycles"] for m in ("cpu", "commands")} for k in cost}
        return {
            "lease_cycles_per_s": round(lease_rate or 0.0, 1),
            "lock_cycles_per_s": round(lock_rate or 0.0, 1),
            "ratio": ratio(lease_rate, lock_rate),
            "lease_server_us_per_cycle": round(per["lease"]["cpu"] * 1e6, 1),
            "lock_server_us_per_cycle": round(per["lock"]["cpu"] * 1e6, 1),
            "lease_commands_per_cycle": round(per["lease"]["commands"], 2),
            "lock_commands_per_cycle": round(per["lock"]["commands"], 2),
            "rounds": {k: [round(r, 1) for r in v] for k, v in rates.items()},
            "cycles_per_block": CYCLE_BLOCK,
            "blocks_per_round": blocks,
        }


# -- set-up: which peers can run here -----------------------------------------


def pinned_bullmq() -> str:
    """The BullMQ version pinned in benchmarks/peer_apps/bullmq/package.json."""
    data = json.loads((BULLMQ_DIR / "package.json").read_text())
    return str(data["dependencies"]["bullmq"])


def setup_bullmq() -> str | None:
    """Installs BullMQ and ioredis into benchmarks/.peers/node; None, or why it cannot run."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "Node.js and npm are not installed: apt-get install nodejs npm"
    NODE_DIR.mkdir(parents=True, exist_ok=True)
    for name in NODE_FILES:
        shutil.copyfile(BULLMQ_DIR / name, NODE_DIR / name)
    installed = NODE_DIR / "node_modules" / "bullmq" / "package.json"
    if installed.exists() and json.loads(installed.read_text())["version"] == pinned_bullmq():
        return None
    log("bullmq: npm ci into benchmarks/.peers/node")
    try:
        done = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"],
            cwd=NODE_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "npm ci of bullmq timed out after 300 s: check that the npm registry is reachable"
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or ["no output"]
        return f"npm ci of bullmq failed ({tail[0]}): check that the npm registry is reachable"
    return None


def setup_celery() -> str | None:
    """None when Celery can be imported, else why not."""
    if importlib.util.find_spec("celery") is None:
        return "Celery is not installed: .venv/bin/pip install -e '.[bench]'"
    return None


def availability(selected: list[str]) -> dict[str, str]:
    """Why each selected peer cannot run here (peers that can are left out)."""
    reasons: dict[str, str] = {}
    checks: dict[str, Callable[[], str | None]] = {"bullmq": setup_bullmq, "celery": setup_celery}
    for peer in selected:
        reason = checks[peer]() if peer in checks else None
        if reason:
            reasons[peer] = reason
            log(f"{peer}: unavailable: {reason}")
    return reasons


def lease_concurrency_flag() -> bool:
    """True when ``redis-lease worker --help`` lists ``--concurrency``."""
    done = subprocess.run(
        [sys.executable, "-m", "redis_lease", "worker", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "200"},
    )
    return "--concurrency" in done.stdout


def versions() -> dict[str, Any]:
    """Versions of the peers' software."""
    found: dict[str, Any] = {"rq": metadata.version("rq"), "bullmq": pinned_bullmq()}
    try:
        found["celery"] = metadata.version("celery")
    except metadata.PackageNotFoundError:
        found["celery"] = None
    node = shutil.which("node")
    if node:
        found["node"] = subprocess.run(
            [node, "--version"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return found


# -- the command line ---------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer items and rounds (minutes)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--peers",
        default=",".join(RUNS),
        help=f"comma-separated peers to run (default: all of {','.join(RUNS)})",
    )
    parser.add_argument(
        "--handlers",
        default=",".join(HANDLERS),
        help=f"comma-separated handlers to run (default: all of {','.join(HANDLERS)})",
    )
    parser.add_argument("--rounds", type=int, default=None, help="rounds per handler")
    args = parser.parse_args(argv)
    args.peers = _pick(parser, "--peers", "peer", args.peers, RUNS)
    args.handlers = _pick(parser, "--handlers", "handler", args.handlers, tuple(HANDLERS))
    if args.rounds is not None and not 1 <= args.rounds <= 50:
        parser.error("--rounds must be from 1 to 50")
    return args


def _pick(
    parser: argparse.ArgumentParser, flag: str, what: str, given: str, known: tuple[str, ...]
) -> list[str]:
    """The names of a comma-separated list, in the order of ``known``; an unknown one or
    none at all is a usage error."""
    chosen = [name.strip() for name in given.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in known]
    if unknown:
        parser.error(f"unknown {what} {unknown[0]!r}: pick from {', '.join(known)}")
    if not chosen:
        parser.error(f"{flag} names no {what}: pick from {', '.join(known)}")
    return [name for name in known if name in chosen]


def item_counts(mode: str, overlap: bool) -> dict[str, dict[str, int]]:
    """Items per handler and peer in ``mode`` (quick or full); the extra concurrency-32
    run has a count for its one handler only."""
    counts = {handler: dict(row) for handler, row in ITEMS[mode].items()}
    if not overlap:
        for handler, n in SEQUENTIAL_LEASE_ITEMS[mode].items():
            counts[handler]["redis_lease"] = n
        counts[C32_HANDLER][C32] = SEQUENTIAL_LEASE_ITEMS[mode][C32_HANDLER]
    return counts


def measure_all(
    harness: Harness,
    peers: list[str],
    counts: dict[str, dict[str, int]],
    rounds: int,
    handlers: list[str] | None = None,
) -> tuple[FigureMap, dict[str, str], dict[str, str]]:
    """Warm-up, then per handler ``rounds`` rounds of every peer in turn (a peer with no
    item count for a handler, like the concurrency-32 run, skips it).

    Returns the figures, the peers whose warm-up failed (with the reason) and the
    handlers that failed later (``peer/handler``: the reason).
    """
    chosen = {h: HANDLERS[h] for h in handlers or HANDLERS}
    broken: dict[str, str] = {}
    failures: dict[str, str] = {}
    for peer in peers:
        if peer == C32 and "redis_lease" in peers:  # the same no-op warm-up: done once
            continue
        log(f"warm-up: {peer}, {WARMUP_ITEMS} no-op items (not reported)")
        try:
            harness.run(peer, 0.0, WARMUP_ITEMS, f"warm-up {peer}")
        except RuntimeError as error:
            broken[peer] = f"warm-up failed: {str(error).splitlines()[0]}"
            log(f"{peer}: {broken[peer]}")
    measured: dict[str, dict[str, list[Round]]] = {
        p: {h: [] for h in chosen if p in counts[h]} for p in peers
    }
    errors: dict[str, dict[str, str]] = {p: {} for p in peers}
    for handler, sleep_ms in chosen.items():
        for number in range(1, rounds + 1):
            for peer in peers:
                if peer in broken or handler in errors[peer] or peer not in counts[handler]:
                    continue
                label = f"{handler} round {number} {peer}"
                items = counts[handler][peer]
                try:
                    result = harness.run(peer, sleep_ms, items, label)
                except RuntimeError as error:
                    errors[peer][handler] = str(error).splitlines()[0]
                    log(f"{label}: FAILED: {errors[peer][handler]}")
                    continue
                measured[peer][handler].append(result)
                log(
                    f"{label}: {result.items} items in {result.seconds:.2f}s = "
                    f"{result.items_per_s:,.0f}/s, {result.server_us_per_item:.1f} us and "
                    f"{result.commands_per_item:.1f} commands per item (load {result.load_1m:.2f})"
                )
    figures: FigureMap = {}
    for peer in peers:
        if peer in broken:
            figures[peer] = None
            continue
        figures[peer] = {
            h: summarize(rs, counts[h][peer]) if rs else None for h, rs in measured[peer].items()
        }
        for handler, why in errors[peer].items():
            failures[f"{peer}/{handler}"] = why
    return figures, broken, failures


def main(argv: list[str] | None = None) -> int:
    """Measures every available peer and prints the table or the JSON object."""
    args = parse_args(argv)
    started = time.perf_counter()
    if shutil.which("redis-server") is None:
        print("peers.py needs redis-server: apt-get install redis-server", file=sys.stderr)
        return 2
    mode = "quick" if args.quick else "full"
    rounds = args.rounds or ROUNDS[mode]
    flag = lease_concurrency_flag()
    overlap = peer_lease_jobs.HAS_CONCURRENCY
    counts = item_counts(mode, overlap)
    unavailable = availability(args.peers)
    runnable = [p for p in args.peers if p not in unavailable]
    with (
        tempfile.TemporaryDirectory(prefix="bench-peers-") as temp,
        redis_for(None, Path(temp)) as (url, kind),
    ):
        if kind != "private redis-server":
            raise RuntimeError("peers.py measures on a private redis-server only")
        os.environ["PEER_CELERY_BROKER"] = url  # read when peer_celery_app is imported
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60)
        harness = Harness(url, client, Path(temp), flag)
        log(f"{mode} mode on a {kind}; {rounds} rounds; peers {', '.join(runnable)}")
        log(f"redis-lease: JobOptions.concurrency {overlap}, worker --concurrency {flag}")
        figures, broken, failures = measure_all(harness, runnable, counts, rounds, args.handlers)
        unavailable.update(broken)
        log("claim + commit cycles against Lock acquire + release cycles")
        cycles = harness.cycles(mode)
        log(f"cycles: {json.dumps(cycles)}")
        leftover = int(client.dbsize())
        info = machine(client)
        client.close()
    peers: FigureMap = {p: figures.get(p) for p in args.peers if p in PEERS}
    c32 = None
    if C32 in args.peers and C32_HANDLER in args.handlers:
        ideal = WORKERS * C32_CONCURRENCY / (HANDLERS[C32_HANDLER] / 1000)
        c32 = concurrency_run(
            figures.get(C32), C32_HANDLER, C32_CONCURRENCY, ideal, figures.get("rq_simple")
        )
    context = {
        "mode": mode,
        "redis": kind,
        "machine": info | versions(),
        "load_average": {"start": list(_LOAD_AT_START), "end": list(os.getloadavg())},
        "workers_per_peer": WORKERS,
        "concurrency": CONCURRENCY,
        "rounds": rounds,
        "handlers_ms": {h: HANDLERS[h] for h in args.handlers},
        "items": counts,
        "redis_lease_overlaps_sleeps": overlap,
        "redis_lease_worker_concurrency_flag": flag,
        "failures": failures,
        "leftover_keys": leftover,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report = build_report(peers, unavailable, cycles, context, c32)
    if args.json:
        print(json.dumps(report))
    else:
        print(table(report))
        c = report["redis_lease_cycle_vs_lock"]
        print(
            f"\nclaim + commit {c['lease_cycles_per_s']:,.0f}/s, "
            f"Lock {c['lock_cycles_per_s']:,.0f}/s: {c['ratio']}x; "
            f"load average {report['load_average']}"
        )
        if c32 and c32["figure"]:
            print(
                f"redis_lease at concurrency {c32['concurrency']}, {c32['handler']}: "
                f"{c32['of_ideal']:.1%} of the ideal {c32['ideal_items_per_s']:,.0f}/s"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
