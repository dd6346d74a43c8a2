"""Throughput and memory of redis-lease, as ratios against a PING baseline on the same Redis.

Figures, all measured in one run (see benchmarks/README.md for what each one means):

1. PING round trips/s on one connection: the baseline.
2. Named claim + commit cycles/s on one connection, and the ratio to PING.
3. claim_next in batches of 100 plus one commit per item: items/s with 1 and 4
   client processes (spawned, started together at a barrier), and their ratios to PING.
4. Bytes of Redis memory per pending item with a 100-byte payload: the ``used_memory``
   delta on a private ``redis-server`` (when one can be started), else the sum of
   ``MEMORY USAGE`` of the run's keys on the given server.

Usage::

    python benchmarks/bench_lease.py [--url redis://127.0.0.1:6379/0] [--items N] [--json]

Every key lives under a fresh ``bench-<uuid>`` prefix and is deleted at the end; the
given server is never flushed.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.commands.core import Script
from redis.utils import HIREDIS_AVAILABLE

from redis_lease.errors import RedisUnavailable
from redis_lease.protocol.connection.urls import safe_url
from redis_lease.protocol.keys import Keys
from redis_lease.protocol.leases import Item
from redis_lease.protocol.store.lease_store import LeaseStore

PAYLOAD_BYTES = 100
BATCH = 100
TTL = 600.0
ROUNDS = 3
BLOCK = 100
WARMUP = 500
PROCESSES = 4
DEFAULT_ITEMS = 20_000
DEFAULT_MEMORY_ITEMS = 50_000
MEMORY_SHARDS = (1, 8)
GOAL_CYCLE_VS_PING = 0.4
GOAL_BYTES_PER_ITEM = 400
BARRIER_TIMEOUT = 120.0
PHASE_TIMEOUT = 300.0
RESULT = {"ok": True}
NOOP_LUA = "return 1"


_STARTED = time.perf_counter()


def log(message: str) -> None:
    """Progress on stderr (seconds since start), so that ``--json`` output stays clean."""
    print(f"[{time.perf_counter() - _STARTED:5.1f}s] {message}", file=sys.stderr, flush=True)


# -- data ---------------------------------------------------------------------


def item_id(number: int, sep: str = ":") -> str:
    """A realistic 22-character item id, e.g. ``acct_000042:2026-12-02``."""
    return f"acct_{number:06d}{sep}2026-12-02"


def payload(number: int) -> dict[str, str]:
    """A JSON payload whose compact encoding is exactly PAYLOAD_BYTES bytes."""
    base = {"account": f"acct_{number:06d}", "pad": ""}
    size = len(json.dumps(base, separators=(",", ":")))
    base["pad"] = "x" * (PAYLOAD_BYTES - size)
    assert len(json.dumps(base, separators=(",", ":"))) == PAYLOAD_BYTES
    return base


def make_items(count: int, start: int = 0) -> list[Item]:
    """``count`` items with 100-byte payloads, numbered from ``start``."""
    return [Item(item_id(n), payload(n)) for n in range(start, start + count)]


def per_second(count: int, seconds: float) -> float:
    """A rate, guarding against a zero interval."""
    return count / seconds if seconds > 0 else float("inf")


# -- single-connection figures ------------------------------------------------


def ping_seconds(client: redis.Redis, count: int) -> float:
    """Seconds for ``count`` PING round trips on one connection."""
    start = time.perf_counter()
    for _ in range(count):
        client.ping()
    return time.perf_counter() - start


def noop_seconds(script: Script, count: int) -> float:
    """Seconds for ``count`` EVALSHA calls of a script that only returns 1 (the script floor)."""
    start = time.perf_counter()
    for _ in range(count):
        script()
    return time.perf_counter() - start


def cycle_seconds(store: LeaseStore, run_id: str, ids: Sequence[str]) -> float:
    """Seconds for a named claim then a commit of each item, once each."""
    start = time.perf_counter()
    for name in ids:
        store.commit(store.claim(run_id, name, "bench", TTL), RESULT)
    return time.perf_counter() - start


def pipelined_seconds(store: LeaseStore, run_id: str, ids: Sequence[str]) -> float:
    """Diagnostic: seconds to commit item i and claim item i+1 in one round trip each.

    This is not a store API; it calls the documented KEYS/ARGV of lua/claim.lua and
    lua/commit.lua with raw EVALSHA in a non-transactional pipeline.
    """
    client = store.client
    keys = store.keys.logged(run_id, store.shard_for(run_id, ids[0]))  # with the attempt log
    claim_sha, commit_sha = store.scripts["claim"].sha, store.scripts["commit"].sha
    result = json.dumps(RESULT, separators=(",", ":"))

    def claim_args(name: str) -> list[Any]:
        return [claim_sha, len(keys), *keys, name, "bench", uuid.uuid4().hex, int(TTL * 1000)]

    start = time.perf_counter()
    row = client.evalsha(*claim_args(ids[0]))
    for index, name in enumerate(ids):
        pipe = client.pipeline(transaction=False)
        pipe.evalsha(commit_sha, len(keys), *keys, name, int(row[1]), row[2], result, "[]", "[]")
        if index + 1 < len(ids):
            pipe.evalsha(*claim_args(ids[index + 1]))
        replies = pipe.execute()
        row = replies[-1]
    return time.perf_counter() - start


def evalsha_server_usec(client: redis.Redis) -> tuple[int, int]:
    """(calls, usec) of EVALSHA from INFO commandstats (includes other clients' calls)."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


# -- multi-process figures ----------------------------------------------------


@dataclass(frozen=True)
class WorkerJob:
    """What one spawned client process does after the barrier."""

    mode: str  # "ping" or "claim_next"
    url: str
    prefix: str
    run_id: str
    worker: str
    count: int  # pings to send, or the most items this process may take


def _worker_main(job: WorkerJob, barrier: Any, out: Any) -> None:
    """Entry of a spawned process: warm up, wait at the barrier, work, report times."""
    store = LeaseStore.from_url(job.url, prefix=job.prefix)
    for _ in range(200):
        store.client.ping()
    done = 0
    if job.mode == "claim_next":
        for lease in store.claim_next(f"{job.run_id}-warm", job.worker, limit=BATCH, ttl=TTL):
            store.commit(lease, RESULT)
        store.shard_count(job.run_id)
    barrier.wait(BARRIER_TIMEOUT)
    start = time.perf_counter()
    deadline = start + PHASE_TIMEOUT
    if job.mode == "ping":
        for _ in range(job.count):
            store.client.ping()
        done = job.count
    else:
        for _ in range(job.count // BATCH + 2):
            leases = store.claim_next(job.run_id, job.worker, limit=BATCH, ttl=TTL)
            if not leases or time.perf_counter() > deadline:
                break
            for lease in leases:
                store.commit(lease, RESULT)
            done += len(leases)
    out.put((job.worker, start, time.perf_counter(), done))
    store.client.close()


def run_processes(jobs: Sequence[WorkerJob]) -> tuple[float, int]:
    """Runs the jobs in spawned processes started together; returns (wall seconds, work done).

    The wall time runs from the earliest start after the barrier to the last finish.
    ``time.perf_counter`` is CLOCK_MONOTONIC on Linux, comparable across processes.
    """
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(jobs))
    out = context.Queue()
    procs = [context.Process(target=_worker_main, args=(job, barrier, out)) for job in jobs]
    for proc in procs:
        proc.start()
    try:
        reports = [out.get(timeout=BARRIER_TIMEOUT + PHASE_TIMEOUT) for _ in jobs]
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
    failed = [proc.exitcode for proc in procs if proc.exitcode != 0]
    if failed:
        raise RuntimeError(f"a benchmark process failed (exit codes {failed})")
    wall = max(r[2] for r in reports) - min(r[1] for r in reports)
    return wall, sum(int(r[3]) for r in reports)


def claim_next_rate(store: LeaseStore, url: str, run_id: str, items: int, processes: int) -> float:
    """Items per second of claim_next(limit=100) + commit per item with ``processes`` clients."""
    store.add(run_id, make_items(items), shards=PROCESSES)
    store.add(f"{run_id}-warm", make_items(BATCH * processes, start=10**6 - 1000), shards=1)
    jobs = [
        WorkerJob("claim_next", url, store.prefix, run_id, f"w{k}", items) for k in range(processes)
    ]
    wall, done = run_processes(jobs)
    counts = store.status(run_id).counts
    if done != items or counts["done"] != items:
        raise RuntimeError(f"{run_id}: committed {done}, status done {counts['done']} of {items}")
    return per_second(items, wall)


# -- memory -------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def private_redis() -> Iterator[str | None]:
    """A throwaway redis-server on a free loopback port; yields its URL, or None."""
    binary = shutil.which("redis-server")
    if binary is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="bench-redis-") as folder:
        port = free_port()
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", folder]
        args += ["--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"]
        args += ["--logfile", str(Path(folder) / "redis.log")]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        try:
            probe = redis.Redis.from_url(url, socket_connect_timeout=0.5)
            for _ in range(200):
                try:
                    probe.ping()
                    break
                except redis.ConnectionError:
                    if proc.poll() is not None:
                        break
                    time.sleep(0.05)
            else:
                raise RuntimeError("private redis-server did not answer PING")
            probe.close()
            yield url if proc.poll() is None else None
        finally:
            proc.terminate()
            proc.wait(timeout=10)


def used_memory(client: redis.Redis) -> int:
    """``used_memory`` once the server had a moment to free closed clients."""
    time.sleep(0.2)
    return int(client.info("memory")["used_memory"])


def memory_usage_sum(client: redis.Redis, keys: Sequence[str]) -> int:
    """The sum of ``MEMORY USAGE key SAMPLES 0`` (exact: every nested value counted)."""
    return sum(int(client.memory_usage(key, samples=0) or 0) for key in keys)


def run_keys(keys: Keys, run_id: str, shards: int) -> list[str]:
    """Every key of one run: its record and the eight keys of each shard (the attempt log too)."""
    return [keys.run(run_id)] + [k for s in range(shards) for k in keys.logged(run_id, s)]


def measure_items(
    url: str, prefix: str, count: int, shards: int, delta: bool
) -> dict[str, float | None]:
    """Bytes per pending item: ``used_memory`` delta (when ``delta``) and MEMORY USAGE sum."""
    store = LeaseStore.from_url(url, prefix=prefix)
    probe = redis.Redis.from_url(url)
    store.add(f"mem-warm-{shards}", make_items(10, start=10**6 - 10), shards=shards)
    store.client.close()
    before = used_memory(probe) if delta else 0
    run_id = f"mem-{shards}"
    store.add(run_id, make_items(count), shards=shards)
    store.client.close()
    after = used_memory(probe) if delta else 0
    usage = memory_usage_sum(probe, run_keys(store.keys, run_id, shards))
    probe.close()
    return {
        "used_memory_delta": (after - before) / count if delta else None,
        "memory_usage_sum": usage / count,
    }


def measure_plain_hash(url: str, prefix: str, count: int) -> float:
    """Peer floor: the same id -> 100-byte payload in one plain hash, no lease state."""
    client = redis.Redis.from_url(url)
    key = f"{prefix}:plain"
    before = used_memory(client)
    for start in range(0, count, 1000):
        mapping: dict[Any, str] = {
            item_id(n): json.dumps(payload(n), separators=(",", ":"))
            for n in range(start, min(count, start + 1000))
        }
        client.hset(key, mapping=mapping)
    after = used_memory(client)
    client.close()
    return (after - before) / count


def measure_rq(url: str, count: int) -> float | None:
    """Peer: RQ's memory per queued job (JSON serializer, same payload), or None without rq."""
    try:
        from rq import Queue
        from rq.serializers import JSONSerializer
    except ImportError:
        return None
    client = redis.Redis.from_url(url)
    queue = Queue(f"bench-{uuid.uuid4().hex[:8]}", connection=client, serializer=JSONSerializer)
    queue.enqueue_many([queue.prepare_data("bench.handle", args=(payload(0),))])
    before = used_memory(client)
    for start in range(0, count, 500):
        datas = [
            queue.prepare_data("bench.handle", args=(payload(n),), job_id=item_id(n, "_"))
            for n in range(start, min(count, start + 500))
        ]
        with client.pipeline() as pipe:
            queue.enqueue_many(datas, pipeline=pipe)
            pipe.execute()
    after = used_memory(client)
    client.close()
    return (after - before) / count


def memory_figures(url: str, count: int) -> dict[str, Any]:
    """Bytes per pending item, preferring a private server's ``used_memory`` delta."""
    figures: dict[str, Any] = {}
    with private_redis() as private:
        if private is not None:
            log(f"memory: private redis-server at {private}, {count} items per layout")
            for shards in MEMORY_SHARDS:
                figures[f"shards_{shards}"] = measure_items(private, "mem", count, shards, True)
            peer_count = min(count, 10_000)
            log(f"memory: peers (plain hash: {count} items, RQ: {peer_count} jobs)")
            figures["plain_hash"] = measure_plain_hash(private, "mem", count)
            figures["rq"] = measure_rq(private, peer_count)
            figures["rq_jobs"] = peer_count
            figures["method"] = "used_memory delta on a private redis-server"
            return figures
    log("memory: no redis-server binary; summing MEMORY USAGE on the given server")
    prefix = f"bench-{uuid.uuid4().hex}"
    try:
        for shards in MEMORY_SHARDS:
            figures[f"shards_{shards}"] = measure_items(url, prefix, count, shards, False)
    finally:
        delete_prefix(redis.Redis.from_url(url), prefix)
    figures["method"] = "sum of MEMORY USAGE of the run's keys"
    return figures


# -- the run ------------------------------------------------------------------


def delete_prefix(client: redis.Redis, prefix: str) -> int:
    """Deletes every key under ``prefix`` (SCAN + UNLINK); returns how many."""
    deleted = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=f"{prefix}:*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += int(client.unlink(*batch))
            batch = []
    if batch:
        deleted += int(client.unlink(*batch))
    return deleted


@dataclass
class Tally:
    """Operations and seconds of one kind, per round of interleaved blocks."""

    counts: list[int] = field(default_factory=lambda: [0] * ROUNDS)
    seconds: list[float] = field(default_factory=lambda: [0.0] * ROUNDS)

    def add(self, number: int, count: int, seconds: float) -> None:
        """Adds one timed block to round ``number``."""
        self.counts[number] += count
        self.seconds[number] += seconds

    @property
    def rate(self) -> float:
        """Operations per second over every round."""
        return per_second(sum(self.counts), sum(self.seconds))

    @property
    def rates(self) -> list[float]:
        """Operations per second of each round."""
        return [per_second(c, s) for c, s in zip(self.counts, self.seconds, strict=True)]


def single_connection(store: LeaseStore, items: int) -> dict[str, Any]:
    """PING, no-op script, claim+commit and pipelined cycles, interleaved in small blocks.

    Each block of BLOCK items times all four in turn on the same connection, so that
    load from elsewhere on the machine affects the baseline and the cycles alike.
    """
    client = store.client
    blocks = max(ROUNDS, items // BLOCK)
    total = blocks * BLOCK
    for run_id in ("cycles", "piped"):
        store.add(run_id, make_items(total + WARMUP), shards=1)
    noop = client.register_script(NOOP_LUA)
    warm = [item_id(n) for n in range(total, total + WARMUP)]
    ping_seconds(client, 2 * WARMUP)
    noop_seconds(noop, WARMUP)
    cycle_seconds(store, "cycles", warm)
    pipelined_seconds(store, "piped", warm)
    tallies = {kind: Tally() for kind in ("ping", "noop", "cycles", "piped")}
    calls = usec = 0
    for block in range(blocks):
        number = block * ROUNDS // blocks
        ids = [item_id(n) for n in range(block * BLOCK, (block + 1) * BLOCK)]
        tallies["ping"].add(number, 2 * BLOCK, ping_seconds(client, 2 * BLOCK))
        tallies["noop"].add(number, BLOCK, noop_seconds(noop, BLOCK))
        calls0, usec0 = evalsha_server_usec(client)
        tallies["cycles"].add(number, BLOCK, cycle_seconds(store, "cycles", ids))
        calls1, usec1 = evalsha_server_usec(client)
        calls, usec = calls + calls1 - calls0, usec + usec1 - usec0
        tallies["piped"].add(number, BLOCK, pipelined_seconds(store, "piped", ids))
    for run_id in ("cycles", "piped"):
        done = store.status(run_id).counts["done"]
        if done != total + WARMUP:
            raise RuntimeError(f"{run_id}: {done} items done, expected {total + WARMUP}")
    return {
        "tallies": tallies,
        "items": total,
        "server_usec_per_script": usec / calls if calls > 0 else None,
    }


def throughput_figures(url: str, items: int) -> dict[str, Any]:
    """Figures 1-3 on the given server, under a fresh prefix deleted at the end."""
    prefix = f"bench-{uuid.uuid4().hex}"
    store = LeaseStore.from_url(url, prefix=prefix)
    client = store.client
    figures: dict[str, Any] = {"redis_version": client.info("server")["redis_version"]}
    try:
        log(f"throughput: {items} items in interleaved blocks of {BLOCK} on {safe_url(url)}")
        figures.update(single_connection(store, items))
        log(f"throughput: PING with {PROCESSES} processes")
        count = max(1, items // PROCESSES)
        jobs = [WorkerJob("ping", url, prefix, "", f"p{k}", count) for k in range(PROCESSES)]
        wall, done = run_processes(jobs)
        figures["ping_4proc"] = per_second(done, wall)
        for processes in (1, PROCESSES):
            log(f"throughput: claim_next batches of {BATCH} with {processes} process(es)")
            figures[f"next_{processes}"] = claim_next_rate(
                store, url, f"next{processes}", items, processes
            )
    finally:
        delete_prefix(client, prefix)
        client.close()
    return figures


def build_report(url: str, items: int, memory_items: int) -> dict[str, Any]:
    """Every figure as one JSON-ready object with stable key names."""
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    tp = throughput_figures(url, items)
    mem = memory_figures(url, memory_items)
    tallies: dict[str, Tally] = tp["tallies"]
    ping, cycles, piped = (tallies[k].rate for k in ("ping", "cycles", "piped"))
    round_ratios = [
        c / p for c, p in zip(tallies["cycles"].rates, tallies["ping"].rates, strict=True)
    ]
    one_shard, eight = mem["shards_1"], mem["shards_8"]
    bytes_per_item = one_shard["used_memory_delta"] or one_shard["memory_usage_sum"]
    ratio = cycles / ping
    report: dict[str, Any] = {
        "redis_version": tp["redis_version"],
        "redis_url": safe_url(url),
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": bool(HIREDIS_AVAILABLE),
        "platform": platform.platform(),
        "nproc": os.cpu_count(),
        "items": tp["items"],
        "memory_items": memory_items,
        "rounds": ROUNDS,
        "block": BLOCK,
        "payload_bytes": PAYLOAD_BYTES,
        "ping_per_s": ping,
        "ping_per_s_rounds": tallies["ping"].rates,
        "ping_per_s_4proc": tp["ping_4proc"],
        "noop_script_per_s": tallies["noop"].rate,
        "claim_commit_cycles_per_s": cycles,
        "claim_commit_cycles_per_s_rounds": tallies["cycles"].rates,
        "claim_commit_vs_ping": ratio,
        "claim_commit_vs_ping_rounds": round_ratios,
        "claim_commit_round_trips_per_cycle": 2,
        "server_usec_per_script_call": tp["server_usec_per_script"],
        "pipelined_cycles_per_s": piped,
        "pipelined_vs_ping": piped / ping,
        "claim_next_batch": BATCH,
        "claim_next_items_per_s_1proc": tp["next_1"],
        "claim_next_items_per_s_4proc": tp[f"next_{PROCESSES}"],
        "claim_next_1proc_vs_ping": tp["next_1"] / ping,
        "claim_next_4proc_vs_ping": tp[f"next_{PROCESSES}"] / ping,
        "bytes_per_pending_item": bytes_per_item,
        "bytes_per_pending_item_method": mem["method"],
        "bytes_per_pending_item_memory_usage": one_shard["memory_usage_sum"],
        "bytes_per_pending_item_8shards": eight["used_memory_delta"] or eight["memory_usage_sum"],
        "bytes_per_pending_item_8shards_memory_usage": eight["memory_usage_sum"],
        "peer_plain_hash_bytes_per_item": mem.get("plain_hash"),
        "peer_rq_bytes_per_queued_job": mem.get("rq"),
        "peer_rq_jobs": mem.get("rq_jobs"),
        "goals": {
            "claim_commit_vs_ping": GOAL_CYCLE_VS_PING,
            "bytes_per_pending_item": GOAL_BYTES_PER_ITEM,
        },
        "goal_met": {
            "claim_commit_vs_ping": ratio >= GOAL_CYCLE_VS_PING,
            "bytes_per_pending_item": bytes_per_item <= GOAL_BYTES_PER_ITEM,
        },
    }
    report["seconds"] = time.perf_counter() - started
    report["load_average_1m"] = [load_before, os.getloadavg()[0]]
    return report


def render_table(report: dict[str, Any]) -> str:
    """The report as a readable table, ratios against the PING baseline."""
    ping = report["ping_per_s"]
    met = report["goal_met"]

    def yes(flag: bool) -> str:
        return "yes" if flag else "NO"

    def rate(label: str, key: str, unit: str = "/s", goal: str = "") -> tuple[str, ...]:
        value = report[key]
        return (label, f"{value:,.0f}{unit}", f"{value / ping:.2f}x", goal)

    def size(label: str, key: str, goal: str = "") -> tuple[str, ...]:
        value = report[key]
        return (label, "-" if value is None else f"{value:,.0f} B", "", goal)

    cycle_goal = f">= {GOAL_CYCLE_VS_PING}x: {yes(met['claim_commit_vs_ping'])}"
    bytes_goal = f"<= {GOAL_BYTES_PER_ITEM} B: {yes(met['bytes_per_pending_item'])}"
    rows = [
        rate("PING, 1 connection (baseline)", "ping_per_s"),
        rate("no-op EVALSHA, 1 connection", "noop_script_per_s"),
        rate("claim + commit cycles, 1 connection", "claim_commit_cycles_per_s", goal=cycle_goal),
        rate("  diagnostic: commit + next claim pipelined", "pipelined_cycles_per_s"),
        rate("claim_next(100) + commit, 1 process", "claim_next_items_per_s_1proc", " items/s"),
        rate(
            f"claim_next(100) + commit, {PROCESSES} processes",
            "claim_next_items_per_s_4proc",
            " items/s",
        ),
        rate(f"  context: PING, {PROCESSES} processes", "ping_per_s_4proc"),
        size("bytes per pending item, 1 shard", "bytes_per_pending_item", bytes_goal),
        size("  same, sum of MEMORY USAGE", "bytes_per_pending_item_memory_usage"),
        size("bytes per pending item, 8 shards", "bytes_per_pending_item_8shards"),
        size("peer: plain hash id -> payload", "peer_plain_hash_bytes_per_item"),
        size("peer: RQ queued job (JSON)", "peer_rq_bytes_per_queued_job"),
    ]
    header = ("figure", "value", "vs PING", "goal")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
    lines = [
        f"redis-lease benchmark: Redis {report['redis_version']} at {report['redis_url']}, "
        f"Python {report['python']}, redis-py {report['redis_py']}"
        f"{' + hiredis' if report['hiredis'] else ''}, nproc {report['nproc']}",
        f"{report['items']} items per throughput figure (1-connection figures interleaved in "
        f"blocks of {BLOCK}, {ROUNDS} rounds), {report['memory_items']} items per memory figure "
        f"({report['bytes_per_pending_item_method']}), payload {PAYLOAD_BYTES} bytes",
        "",
    ]
    sep = "  "
    lines.append(sep.join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    lines.append(sep.join("-" * w for w in widths))
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1])]
        cells += [row[2].rjust(widths[2]), row[3].ljust(widths[3])]
        lines.append(sep.join(cells).rstrip())
    usec = report["server_usec_per_script_call"]
    lines += [
        "",
        "per round: PING "
        + spread(report["ping_per_s_rounds"], "{:,.0f}/s")
        + "; cycles "
        + spread(report["claim_commit_cycles_per_s_rounds"], "{:,.0f}/s")
        + "; cycles vs PING "
        + spread(report["claim_commit_vs_ping_rounds"], "{:.2f}x"),
        "server time per claim/commit script call (INFO commandstats): "
        + ("-" if usec is None else f"{usec:.1f} us"),
        f"finished in {report['seconds']:.1f} s; 1-minute load average at start / end: "
        + spread(report["load_average_1m"], "{:.2f}"),
    ]
    return "\n".join(lines)


def spread(values: Sequence[float], form: str) -> str:
    """Values of the rounds, e.g. ``0.24x / 0.25x / 0.23x``."""
    return " / ".join(form.format(v) for v in values)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--url",
        default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="the Redis for the throughput figures (default: $REDIS_URL or 127.0.0.1:6379)",
    )
    parser.add_argument(
        "--items",
        type=positive,
        default=DEFAULT_ITEMS,
        help=f"items per throughput figure (default {DEFAULT_ITEMS})",
    )
    parser.add_argument(
        "--memory-items",
        type=positive,
        default=DEFAULT_MEMORY_ITEMS,
        help=f"pending items per memory figure (default {DEFAULT_MEMORY_ITEMS})",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def positive(text: str) -> int:
    """An argparse type: a whole number from 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def main(argv: Sequence[str] | None = None, printer: Callable[[str], None] = print) -> int:
    """Runs the benchmark and prints the table or JSON; returns the exit code."""
    args = parse_args(argv)
    try:
        report = build_report(args.url, args.items, args.memory_items)
    except (redis.ConnectionError, RedisUnavailable) as error:
        log(f"error: {error}")
        return 2
    printer(json.dumps(report, indent=2) if args.json else render_table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
