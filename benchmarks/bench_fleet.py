"""End-to-end items/s of a worker fleet: redis-lease shard jobs against one RQ job per item.

Figures, all measured in one run on the same Redis with the same number of worker
processes (2 by default) and a handler that does nothing (see benchmarks/README.md):

(a)  redis-lease: a run of ``--items`` items over ``--shards`` shards, planned with
     ``Runs.ensure`` + ``Runs.plan``, one RQ shard job per shard enqueued with
     ``dispatch.enqueue_shard``, worked by ``python -m redis_lease worker --simple
     --burst`` processes. Timed from worker start until ``store.status`` shows every
     item done (planning and enqueueing are not timed).
(a2) the same with the forking ``redis-lease worker --burst`` (one fork per shard job).
(b)  RQ baseline: ``--rq-jobs`` no-op RQ jobs (JSON serializer), one per item, worked
     by ``rq worker --burst --worker-class rq.SimpleWorker`` processes. Timed from
     worker start until the finished and failed registries hold every job.
(c)  the same with RQ's default forking ``rq worker`` (``--fork-jobs`` jobs).

Goal: (a) at least 20 times (b). Each figure also says when the first item was done
(worker start-up) and the rate after it (steady items/s).

Usage::

    python benchmarks/bench_fleet.py [--url URL] [--items N] [--rq-jobs N] [--json]

Without ``--url`` (or ``REDIS_URL``) the benchmark starts a private ``redis-server``
on a free loopback port in a temp dir, so that no RQ key touches a shared server; if
none is installed it uses redis://127.0.0.1:6379/0. Every key lives under a fresh
``fleet-<hex>`` prefix or queue name and is deleted at the end; no server is flushed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from types import ModuleType
from typing import Any

import redis
import rq
from rq import Queue
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from redis_lease.fleet.jobs.job import JobOptions
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport.shard_jobs import enqueue_shard
from redis_lease.protocol.connection.urls import safe_url
from redis_lease.protocol.store.lease_store import LeaseStore

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_URL = "redis://127.0.0.1:6379/0"
GOAL_RATIO = 20.0
POLL_SECONDS = 0.02
PHASE_TIMEOUT = 300.0
ENQUEUE_BLOCK = 500
WARMUP_ITEMS = 400
WARMUP_JOBS = 100
SHARD_BUDGET = 600.0
#: Keys every RQ worker may set (with a TTL); deleted at the end only if this run made them.
RQ_GLOBAL_KEYS = ("rq:clean_groups",)

_STARTED = time.perf_counter()


def log(message: str) -> None:
    """Progress on stderr (seconds since start), so that ``--json`` output stays clean."""
    print(f"[{time.perf_counter() - _STARTED:6.1f}s] {message}", file=sys.stderr, flush=True)


# -- the Redis server ---------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def redis_for(url: str | None, folder: Path) -> Iterator[tuple[str, str]]:
    """The Redis to measure on: ``url``, else a private redis-server; yields (URL, kind)."""
    binary = shutil.which("redis-server")
    if url or binary is None:
        yield url or DEFAULT_URL, "given" if url else "default (no redis-server binary)"
        return
    port = _free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(folder)]
    args += ["--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"]
    args += ["--logfile", str(folder / "redis.log")]
    # A session of its own: Ctrl-C reaches the benchmark, which stops the server when done.
    server = subprocess.Popen(
        args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    private = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(private, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("private redis-server did not start") from None
                time.sleep(0.02)
        client.close()
        yield private, "private redis-server"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


# -- worker processes ---------------------------------------------------------


@dataclass
class Fleet:
    """Worker processes started together; their output goes to log files."""

    commands: list[list[str]]
    env: dict[str, str]
    folder: Path
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> None:
        """Starts every worker."""
        for number, command in enumerate(self.commands):
            out = (self.folder / f"worker-{uuid.uuid4().hex[:6]}-{number}.log").open("wb")
            self.processes.append(
                subprocess.Popen(
                    command, cwd=ROOT, env=self.env, stdout=out, stderr=subprocess.STDOUT
                )
            )
            out.close()

    def alive(self) -> bool:
        """True while any worker runs."""
        return any(p.poll() is None for p in self.processes)

    def wait(self, timeout: float) -> list[int]:
        """Waits for every worker to exit (killing the ones still running); their exit codes."""
        deadline = time.monotonic() + timeout
        codes = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                process.kill()
                codes.append(process.wait(timeout=10))
        return codes

    def output(self) -> str:
        """The tail of every worker's log (for error messages)."""
        tails = [p.read_text(errors="replace")[-1500:] for p in sorted(self.folder.glob("*.log"))]
        return "\n".join(t for t in tails if t.strip())


def worker_env(module_env: dict[str, str], pycache: Path) -> dict[str, str]:
    """The workers' environment: the repository root on PYTHONPATH, the job options.

    Byte code is cached under ``pycache`` (written during the warm-up), so that no
    worker compiles its imports from source even where PYTHONDONTWRITEBYTECODE is
    set: an installed wheel is byte-compiled too.
    """
    env = {**os.environ, **module_env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONPYCACHEPREFIX"] = str(pycache)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("REDIS_LEASE_URL", None)
    return env


# -- measuring ----------------------------------------------------------------


@dataclass
class Figure:
    """One measured fleet: how long the workers took to finish ``units`` items or jobs."""

    label: str
    system: str
    worker: str
    workers: int
    units: int
    seconds: float
    first_done_seconds: float
    done: int
    failed: int
    exit_codes: list[int]
    setup_seconds: float
    server: dict[str, float] | None = None

    @property
    def rate(self) -> float:
        """Items (or jobs) finished per second, end to end."""
        return self.done / self.seconds if self.seconds > 0 else 0.0

    @property
    def steady_rate(self) -> float:
        """Items per second after the first one was done (worker start-up left out)."""
        span = self.seconds - self.first_done_seconds
        return (self.done - 1) / span if span > 0 and self.done > 1 else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The figure as JSON-ready data."""
        data = asdict(self)
        data["items_per_s"] = round(self.rate, 1)
        data["steady_items_per_s"] = round(self.steady_rate, 1)
        for name in ("seconds", "first_done_seconds", "setup_seconds"):
            data[name] = round(data[name], 3)
        return data


#: The server's counters, read with one INFO: commands (those run inside scripts too),
#: script calls (EVALSHA and EVAL) and CPU seconds.
Counters = dict[str, float]


def counters(client: redis.Redis) -> Counters | None:
    """The server's counters now, or None when INFO is refused (managed Redis)."""
    try:
        info = client.info("everything")
    except redis.ResponseError:
        return None
    scripts = sum(info.get(f"cmdstat_{n}", {}).get("calls", 0) for n in ("evalsha", "eval"))
    return {
        "commands": float(info["total_commands_processed"]),
        "scripts": float(scripts),
        "cpu": float(info["used_cpu_sys"]) + float(info["used_cpu_user"]),
    }


def server_cost(
    before: Counters | None, after: Counters | None, poll: Counters | None, polls: int, units: int
) -> dict[str, float] | None:
    """Per unit: Redis commands (inside scripts too), script calls and server CPU microseconds.

    The benchmark's own polling is subtracted from the counts (``poll`` is the cost of
    one poll, measured before the fleet started); each INFO counts as one command.
    The CPU figure includes the polling.
    """
    if before is None or after is None or poll is None:
        return None
    commands = after["commands"] - before["commands"] - 1 - polls * poll["commands"]
    scripts = after["scripts"] - before["scripts"] - polls * poll["scripts"]
    return {
        "commands_per_unit": round(commands / units, 2),
        "scripts_per_unit": round(scripts / units, 3),
        "server_cpu_us_per_unit": round((after["cpu"] - before["cpu"]) * 1e6 / units, 1),
    }


def watch(
    fleet: Fleet, total: int, progress: Callable[[], tuple[int, int]], what: str
) -> tuple[float, float, int, int, int]:
    """Starts the fleet and polls until ``total`` units ended.

    Returns (seconds, seconds until the first was done, done, failed, polls).

    Raises RuntimeError when the workers exit (or PHASE_TIMEOUT passes) before that.
    """
    started = time.perf_counter()
    fleet.start()
    first = 0.0
    done = failed = polls = 0
    while True:
        done, failed = progress()
        polls += 1
        now = time.perf_counter() - started
        if done and not first:
            first = now
        if done + failed >= total:
            return now, first, done, failed, polls
        if now > PHASE_TIMEOUT or not fleet.alive():
            codes = fleet.wait(10)
            raise RuntimeError(
                f"{what}: {done + failed} of {total} finished after {now:.1f}s, workers exited "
                f"{codes}\n{fleet.output()}"
            )
        time.sleep(POLL_SECONDS)


def slug(label: str) -> str:
    """A figure's label as a name RQ accepts in queue names and job ids: ``(a2)`` -> ``a2``."""
    return "".join(c if c.isalnum() else "-" for c in label.strip("()"))


@dataclass
class Bench:
    """One benchmark run: its Redis, prefix, queues and the jobs it made (for cleanup)."""

    url: str
    client: redis.Redis
    tag: str
    workers: int
    shards: int
    batch_size: int
    folder: Path
    shard_jobs: list[str] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)
    existed: list[str] = field(default_factory=list)
    _days: int = 0

    def __post_init__(self) -> None:
        self.existed = [key for key in RQ_GLOBAL_KEYS if self.client.exists(key)]

    @property
    def prefix(self) -> str:
        """Every redis-lease key of this run starts with it."""
        return f"fleet-{self.tag}"

    def queue_name(self, mode: str) -> str:
        """A queue name of this run (remembered for cleanup)."""
        name = f"fleet-{self.tag}-{mode}"
        if name not in self.queues:
            self.queues.append(name)
        return name

    def module_env(self, queue_name: str) -> dict[str, str]:
        """The environment that configures ``benchmarks.fleet_jobs``."""
        return {
            "BENCH_FLEET_QUEUE": queue_name,
            "BENCH_FLEET_SHARDS": str(self.shards),
            "BENCH_FLEET_BATCH": str(self.batch_size),
        }

    def jobs_module(self) -> ModuleType:
        """``benchmarks.fleet_jobs``, imported with this run's options."""
        os.environ.update(self.module_env(self.queue_name("lease")))
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        return importlib.import_module("benchmarks.fleet_jobs")

    def lease(self, label: str, items: int, simple: bool) -> Figure:
        """Figure (a)/(a2): a planned run of ``items`` items worked by redis-lease workers."""
        module = self.jobs_module()
        job = module.noop_job
        queue_name = job.options.queue
        store = LeaseStore(self.client, prefix=self.prefix, url=self.url)
        runs = Runs(store)
        self._days += 1
        setup = time.perf_counter()
        run_id, _ = runs.ensure(job, date.fromordinal(730_000 + self._days), runs.server_now())
        os.environ[module.ITEMS_ENV] = str(items)
        planned = runs.plan(job, run_id)
        if planned != items:
            raise RuntimeError(f"planned {planned} items, expected {items}")
        for shard in range(job.options.shards):
            self.shard_jobs.append(
                enqueue_shard(store, module.JOB_PATH, queue_name, run_id, shard, SHARD_BUDGET)
            )
        setup_seconds = time.perf_counter() - setup
        base = [sys.executable, "-m", "redis_lease", "--url", self.url, "--prefix", self.prefix]
        commands = [
            [*base, "worker", "--burst", "--queue", queue_name, "--name", f"{queue_name}-{n}"]
            + (["--simple"] if simple else [])
            for n in range(self.workers)
        ]
        fleet = Fleet(
            commands,
            worker_env(self.module_env(queue_name), self.folder / "pycache"),
            self._logs(label),
        )

        def progress() -> tuple[int, int]:
            counts = store.status(run_id).counts
            return counts["done"], counts["dead"]

        worker = "SimpleWorker" if simple else "Worker (fork)"
        return self._measure(label, "redis-lease", worker, fleet, items, progress, setup_seconds)

    def rq_baseline(self, label: str, jobs: int, worker_class: str) -> Figure:
        """Figure (b)/(c): ``jobs`` no-op RQ jobs, one per item, worked by ``rq worker``."""
        module = self.jobs_module()
        queue_name = self.queue_name(slug(label))
        queue = Queue(queue_name, connection=self.client, serializer=JSONSerializer)
        setup = time.perf_counter()
        for start in range(0, jobs, ENQUEUE_BLOCK):
            datas = [
                Queue.prepare_data(
                    module.NOOP_PATH, job_id=f"{queue_name}-{n}", result_ttl=3600, timeout=60
                )
                for n in range(start, min(jobs, start + ENQUEUE_BLOCK))
            ]
            with self.client.pipeline() as pipe:
                queue.enqueue_many(datas, pipeline=pipe)
                pipe.execute()
        if queue.count != jobs:
            raise RuntimeError(f"enqueued {queue.count} RQ jobs, expected {jobs}")
        setup_seconds = time.perf_counter() - setup
        base = [sys.executable, "-m", "rq.cli", "worker", "--burst", "--url", self.url]
        base += ["--serializer", "rq.serializers.JSONSerializer", "--worker-class", worker_class]
        base += ["--logging_level", "WARNING"]
        commands = [[*base, "--name", f"{queue_name}-{n}", queue_name] for n in range(self.workers)]
        fleet = Fleet(commands, worker_env({}, self.folder / "pycache"), self._logs(label))
        finished, failed = queue.finished_job_registry, queue.failed_job_registry

        def progress() -> tuple[int, int]:
            with self.client.pipeline(transaction=False) as pipe:
                pipe.zcard(finished.key)
                pipe.zcard(failed.key)
                done, dead = pipe.execute()
            return int(done), int(dead)

        worker = worker_class.rpartition(".")[2]
        return self._measure(label, "rq", worker, fleet, jobs, progress, setup_seconds)

    def _measure(
        self,
        label: str,
        system: str,
        worker: str,
        fleet: Fleet,
        units: int,
        progress: Callable[[], tuple[int, int]],
        setup_seconds: float,
    ) -> Figure:
        """Times the fleet through ``units`` and reads the server's counters around it."""
        start = counters(self.client)
        progress()
        before = counters(self.client)
        poll = None
        if start is not None and before is not None:
            poll = {k: before[k] - start[k] for k in start}
            poll["commands"] -= 1
        seconds, first, done, failed, polls = watch(fleet, units, progress, label)
        codes = fleet.wait(30)
        cost = server_cost(before, counters(self.client), poll, polls, units)
        return Figure(
            label,
            system,
            worker,
            self.workers,
            units,
            seconds,
            first,
            done,
            failed,
            codes,
            setup_seconds,
            cost,
        )

    def _logs(self, label: str) -> Path:
        folder = self.folder / slug(label)
        folder.mkdir(exist_ok=True)
        return folder

    # -- cleanup --------------------------------------------------------------

    def cleanup(self) -> int:
        """Deletes every key this run made; returns how many keys with its marks remain."""
        client = self.client
        for name in self.queues:
            queue = Queue(name, connection=client, serializer=JSONSerializer)
            registries = [
                queue.finished_job_registry,
                queue.failed_job_registry,
                queue.started_job_registry,
                queue.deferred_job_registry,
                queue.scheduled_job_registry,
                queue.canceled_job_registry,
            ]
            ids = set(queue.get_job_ids())
            for registry in registries:
                ids.update(registry.get_job_ids(cleanup=False))
            ids.update(self.shard_jobs)
            id_list = sorted(ids)
            for start in range(0, len(id_list), ENQUEUE_BLOCK):
                block = id_list[start : start + ENQUEUE_BLOCK]
                found = RQJob.fetch_many(block, connection=client, serializer=JSONSerializer)
                with client.pipeline() as pipe:
                    for rq_job in found:
                        if rq_job is not None:
                            rq_job.delete(pipeline=pipe)
                    pipe.execute()
            client.delete(*(r.key for r in registries))
            queue.delete(delete_jobs=True)
        marks = [self.tag, *self.shard_jobs]
        leftover = [
            key
            for key in client.scan_iter(match="rq:*", count=1000)
            if any(mark in key.decode(errors="replace") for mark in marks)
        ]
        leftover += list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
        for start in range(0, len(leftover), 1000):
            client.delete(*leftover[start : start + 1000])
        for members_key in ("rq:workers", "rq:queues"):
            stale = [m for m in client.smembers(members_key) if self.tag.encode() in m]
            if stale:
                client.srem(members_key, *stale)
        made = [key for key in RQ_GLOBAL_KEYS if key not in self.existed]
        if made:
            client.delete(*made)
        remaining = list(client.scan_iter(match=f"*{self.tag}*", count=1000))
        remaining += list(client.scan_iter(match=f"{self.prefix}:*", count=1000))
        return len(remaining)


# -- report -------------------------------------------------------------------


def machine(client: redis.Redis) -> dict[str, Any]:
    """What the figures were measured on."""
    server = client.info("server")
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": server.get("redis_version"),
        "redis_py": redis.__version__,
        "rq": rq.__version__,
        "hiredis": redis.utils.HIREDIS_AVAILABLE,
    }


def table(figures: list[Figure], ratios: dict[str, float]) -> str:
    """The results as a Markdown table."""
    head = (
        "| figure | system, worker | procs | items | seconds | first done s | items/s "
        "| steady items/s | (a) / this | Redis cmds/item | scripts/item | server CPU us/item |"
    )
    rows = [head, "|" + "---|" * 12]
    for fig in figures:
        ratio = ratios.get(fig.label)
        cost = fig.server or {}
        rows.append(
            f"| {fig.label} | {fig.system}, {fig.worker} | {fig.workers} | {fig.units} "
            f"| {fig.seconds:.2f} | {fig.first_done_seconds:.2f} | {fig.rate:,.0f} "
            f"| {fig.steady_rate:,.0f} | {'' if ratio is None else f'{ratio:.1f}x'} "
            f"| {cost.get('commands_per_unit', '')} | {cost.get('scripts_per_unit', '')} "
            f"| {cost.get('server_cpu_us_per_unit', '')} |"
        )
    return "\n".join(rows)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--url",
        default=os.environ.get("REDIS_URL"),
        help=f"Redis URL (default: REDIS_URL, else a private redis-server, else {DEFAULT_URL})",
    )
    parser.add_argument("--items", type=int, default=20_000, help="items of run (a)")
    parser.add_argument("--shards", type=int, default=8, help="shards of run (a)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=JobOptions().batch_size,
        help="the most items per claim_next (the job default)",
    )
    parser.add_argument("--rq-jobs", type=int, default=2_000, help="RQ jobs of (b)")
    parser.add_argument("--fork-jobs", type=int, default=500, help="RQ jobs of (c)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes per fleet")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    for name in ("items", "shards", "batch_size", "rq_jobs", "fork_jobs", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.workers > 32 or args.items > 1_000_000 or max(args.rq_jobs, args.fork_jobs) > 100_000:
        parser.error("keep it bounded: --workers <= 32, --items <= 1e6, RQ jobs <= 1e5")
    return args


def main(argv: list[str] | None = None) -> int:
    """Runs every fleet once (after a warm-up) and prints the table or the JSON object."""
    args = parse_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="bench-fleet-") as temp,
        redis_for(args.url, Path(temp)) as (url, kind),
    ):
        client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=60)
        bench = Bench(
            url,
            client,
            uuid.uuid4().hex[:10],
            args.workers,
            args.shards,
            args.batch_size,
            Path(temp),
        )
        log(f"redis at {safe_url(url)} ({kind}); prefix {bench.prefix}")
        figures: list[Figure] = []
        try:
            log("warm-up: a small redis-lease run and a few RQ jobs (not reported)")
            bench.lease("warm-up lease", WARMUP_ITEMS, simple=True)
            bench.rq_baseline("warm-up rq", WARMUP_JOBS, "rq.SimpleWorker")
            plan: list[tuple[str, Callable[[], Figure]]] = [
                ("(a)", lambda: bench.lease("(a)", args.items, simple=True)),
                ("(a2)", lambda: bench.lease("(a2)", args.items, simple=False)),
                ("(b)", lambda: bench.rq_baseline("(b)", args.rq_jobs, "rq.SimpleWorker")),
                ("(c)", lambda: bench.rq_baseline("(c)", args.fork_jobs, "rq.Worker")),
            ]
            for label, measure in plan:
                log(f"{label}: measuring")
                figure = measure()
                log(f"{label}: {figure.done} in {figure.seconds:.2f}s = {figure.rate:,.0f}/s")
                figures.append(figure)
        finally:
            remaining = bench.cleanup()
            log(f"cleanup: {remaining} keys of this run remain")
            info = machine(client)
            client.close()
    base = figures[0].rate
    ratios = {fig.label: base / fig.rate for fig in figures if fig.rate > 0}
    goal = ratios.get("(b)", 0.0)
    met = goal >= GOAL_RATIO
    if args.json:
        print(
            json.dumps(
                {
                    "redis": kind,
                    "machine": info,
                    "options": vars(args) | {"url": safe_url(url)},
                    "figures": [f.to_dict() for f in figures],
                    "ratios": {k: round(v, 2) for k, v in ratios.items()},
                    "goal": {"a_over_b": round(goal, 2), "at_least": GOAL_RATIO, "met": met},
                    "leftover_keys": remaining,
                }
            )
        )
    else:
        print(table(figures, ratios))
        print()
        print(
            f"goal (a) >= {GOAL_RATIO:.0f}x (b): {goal:.1f}x, {'met' if met else 'NOT met'}; "
            f"machine: {json.dumps(info)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
