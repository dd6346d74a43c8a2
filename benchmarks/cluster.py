"""A worker fleet with its lease state on one Redis against the same on a 3-primary cluster.

Both sides run the same job and handler (``peer_lease_jobs``: a no-op by default) over
16 shards, worked by the same number of real ``redis-lease worker --simple --burst``
processes, with RQ's queues on one private plain ``redis-server`` (``--queue-url``) in
both: the only difference is where the lease state lives. Every server is private: one
redis-server for RQ, one for the lease state ("one") and three cluster-enabled primaries
("cluster"), all started with the same options on free loopback ports in a temporary
directory (``tests/redis_server.py``, ``tests/redis_cluster.py``) and stopped at the end.

After a warm-up of each (not reported), rounds alternate: one, cluster, one, cluster, ...
Each round measures the consume phase, from the first poll that sees an item done to the
poll that sees every item done (worker start-up left out), and reports the medians, and
the ratio cluster / one of the medians and of each round's pair of runs:

- ``items_per_s``: items done per second in the phase;
- ``server_us_per_item``: the delta of ``used_cpu_user + used_cpu_sys`` (``INFO cpu``)
  over the phase / its items, on the lease server, or summed over the cluster's
  primaries (each primary's own figure too); the RQ server's apart;
- ``scripts_per_item`` and ``commands_per_item`` (``INFO commandstats``);
- on the cluster, the spread of each round: shards, items, script calls and server CPU
  per primary.

The harness's own polls (one ``HGET`` of ``done`` and one ``ZCARD`` of the dead index
per shard, every 25 ms) are measured before the workers start and subtracted, with the
``INFO`` calls. It ends with the arithmetic of a cluster on separate machines: with S
server µs per item, one Redis core saturates near 1e6/S items/s, three primaries on three
machines near three times that; here the three primaries share this machine's cores with
the workers, so the measured ratio is not that figure.

Usage::

    python benchmarks/cluster.py [--quick] [--json] [--rounds N] [--items N] [--warmup N]
                                 [--workers N] [--handler-ms MS] [--concurrency N]

``--quick`` (3 rounds of 6,000 items) takes about 25 s, the full mode (9 rounds of 40,000)
2 to 3 minutes. Progress goes to stderr; ``--json`` prints one JSON object on stdout.
Needs ``redis-server`` and ``redis-cli``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

import redis
from redis.crc import key_slot

ROOT = Path(__file__).resolve().parent.parent
PEERS_DIR = ROOT / "benchmarks" / "peer_apps"
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(PEERS_DIR) not in sys.path:
    sys.path.insert(0, str(PEERS_DIR))

import peer_lease_jobs  # type: ignore[import-not-found]  # noqa: E402

from benchmarks.bench_fleet import Fleet, log, machine, worker_env  # noqa: E402
from benchmarks.peers import Snapshot, snapshot  # noqa: E402
from benchmarks.peers_report import median, ratio  # noqa: E402
from redis_lease.fleet.runs.lifecycle import Runs  # noqa: E402
from redis_lease.fleet.transport.shard_jobs import enqueue_shard  # noqa: E402
from redis_lease.protocol.connection.clients import client_from_url  # noqa: E402
from redis_lease.protocol.store.lease_store import LeaseStore  # noqa: E402
from tests.redis_cluster import ClusterServers  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

BACKENDS = ("one", "cluster")
PRIMARIES = 3
SHARDS = 16
BATCH = 20
WORKERS = 2
POLL_SECONDS = 0.025
CALIBRATION_POLLS = 20
WARMUP_ITEMS = 400
RUN_TIMEOUT = 240.0
#: Items per round and rounds per backend, by mode.
ITEMS = {"quick": 6_000, "full": 40_000}
ROUNDS = {"quick": 3, "full": 9}
#: The commands that run a script.
SCRIPT_COMMANDS = ("evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro")
#: The arithmetic's caveat, printed and kept in the JSON.
SHARED_CORES = (
    "measured on one machine of {nproc} cores: the cluster's {primaries} redis-servers share "
    "those cores with each other, the RQ server and the workers, so the measured ratio "
    "cluster/one is not the scale-out figure; the figures above it are arithmetic"
)

_LOAD_AT_START = os.getloadavg()


# -- server counters ------------------------------------------------------------


@dataclass
class Usage:
    """What one server did over a phase, the harness's own share taken out."""

    cpu: float
    calls: dict[str, float]

    @property
    def scripts(self) -> float:
        """Script calls."""
        return sum(self.calls.get(name, 0.0) for name in SCRIPT_COMMANDS)

    @property
    def commands(self) -> float:
        """Every command, those run inside scripts too."""
        return sum(self.calls.values())


def usage(before: Snapshot, after: Snapshot, poll: Usage, polls: int, info_cpu: float) -> Usage:
    """A server's use between two snapshots, less ``polls`` polls of ``poll`` each and the
    ``INFO`` that took ``before`` (one call, ``info_cpu`` seconds)."""
    calls: dict[str, float] = {}
    for name, count in after.calls.items():
        left = count - before.calls.get(name, 0) - polls * poll.calls.get(name, 0.0)
        left -= 1 if name == "info" else 0
        if left > 1e-9:
            calls[name] = left
    cpu = max(0.0, after.cpu - before.cpu - polls * poll.cpu - info_cpu)
    return Usage(cpu, calls)


# -- one round ------------------------------------------------------------------


@dataclass
class Round:
    """One measured consume phase: its items, time and what each server spent on it."""

    backend: str
    items: int
    seconds: float
    startup_seconds: float
    #: The lease state's servers (one, or each primary), by name.
    nodes: dict[str, Usage]
    rq: Usage
    load_1m: float
    failed: int = 0
    polls: int = 0
    #: The round's number (0: not numbered), pairing it with the other side's.
    number: int = 0
    #: Per primary: its shards and the items they held (cluster rounds only).
    shards: dict[str, int] = field(default_factory=dict)
    shard_items: dict[str, int] = field(default_factory=dict)

    @property
    def items_per_s(self) -> float:
        """Items done per second in the phase."""
        return self.items / self.seconds if self.seconds > 0 else 0.0

    def per_item(self, total: float) -> float:
        """``total`` per item of the phase."""
        return total / self.items if self.items else 0.0

    @property
    def server_us_per_item(self) -> float:
        """Server CPU µs per item over the lease state's servers (summed)."""
        return self.per_item(sum(n.cpu for n in self.nodes.values()) * 1e6)

    @property
    def scripts_per_item(self) -> float:
        """Script calls per item on the lease state's servers."""
        return self.per_item(sum(n.scripts for n in self.nodes.values()))

    @property
    def commands_per_item(self) -> float:
        """Commands per item on the lease state's servers (inside scripts too)."""
        return self.per_item(sum(n.commands for n in self.nodes.values()))

    def spread(self) -> dict[str, dict[str, Any]]:
        """Per server: shards, items, share of script calls and of server CPU."""
        return spread(self.nodes, self.shards, self.shard_items)

    def to_dict(self) -> dict[str, Any]:
        """The round as JSON-ready data."""
        data: dict[str, Any] = {
            "round": self.number,
            "items": self.items,
            "seconds": round(self.seconds, 3),
            "items_per_s": round(self.items_per_s, 1),
            "server_us_per_item": round(self.server_us_per_item, 1),
            "node_us_per_item": {
                name: round(self.per_item(n.cpu * 1e6), 1) for name, n in self.nodes.items()
            },
            "rq_server_us_per_item": round(self.per_item(self.rq.cpu * 1e6), 1),
            "scripts_per_item": round(self.scripts_per_item, 3),
            "commands_per_item": round(self.commands_per_item, 2),
            "startup_seconds": round(self.startup_seconds, 2),
            "failed": self.failed,
            "harness_polls": self.polls,
            "load_1m": round(self.load_1m, 2),
        }
        if self.shards:
            data["spread"] = self.spread()
        return data


def spread(
    nodes: dict[str, Usage], shards: dict[str, int], shard_items: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """Per server: its shards, their items, and its shares of script calls and server CPU."""
    scripts = sum(n.scripts for n in nodes.values())
    cpu = sum(n.cpu for n in nodes.values())
    return {
        name: {
            "shards": shards.get(name, 0),
            "items": shard_items.get(name, 0),
            "script_share": round(node.scripts / scripts, 3) if scripts else None,
            "cpu_share": round(node.cpu / cpu, 3) if cpu else None,
        }
        for name, node in nodes.items()
    }


# -- the servers and the runs ----------------------------------------------------


@dataclass
class Backend:
    """Where the lease state lives: its URL, its client and a plain client per server."""

    name: str
    url: str
    client: redis.Redis
    #: Plain clients of each server of the lease state, by name (for INFO and FLUSHALL).
    nodes: dict[str, redis.Redis]
    #: The port of each server, by name.
    ports: dict[str, int]
    #: On a cluster, the owner of a slot (the server's name); None on one server.
    owner: Callable[[int], str] | None = None


@dataclass
class Harness:
    """The private servers, the workers' options and the runs made so far."""

    rq_url: str
    rq: redis.Redis
    folder: Path
    workers: int
    sleep_ms: float
    concurrency: int
    runs_made: int = 0

    def env(self, queue: str) -> dict[str, str]:
        """The workers' environment: bench_fleet's, with the job's module importable."""
        env = worker_env(
            {
                peer_lease_jobs.QUEUE_ENV: queue,
                peer_lease_jobs.SHARDS_ENV: str(SHARDS),
                peer_lease_jobs.BATCH_ENV: str(BATCH),
                peer_lease_jobs.SLEEP_MS_ENV: str(self.sleep_ms),
                peer_lease_jobs.CONCURRENCY_ENV: str(self.concurrency),
            },
            self.folder / "pycache",
        )
        env["PYTHONPATH"] = os.pathsep.join((str(PEERS_DIR), env["PYTHONPATH"]))
        env.pop("REDIS_LEASE_QUEUE_URL", None)
        return env

    def run(self, backend: Backend, items: int, label: str) -> Round:
        """Plans ``items`` items, works them with the fleet, then empties every server."""
        try:
            return self._run(backend, items, label)
        finally:
            # Every server here is this harness's own (started in main): emptied between runs.
            for node in backend.nodes.values():
                node.flushall()
            self.rq.flushall()

    def _run(self, backend: Backend, items: int, label: str) -> Round:
        self.runs_made += 1
        name = f"bench-{backend.name}-{self.runs_made}"
        job = peer_lease_jobs.make_job(name, SHARDS, BATCH, self.sleep_ms, self.concurrency, items)
        store = LeaseStore(backend.client, prefix=name, url=backend.url, rq_client=self.rq)
        runs = Runs(store)
        run_id, _ = runs.ensure(job, date.fromordinal(730_000 + self.runs_made), runs.server_now())
        planned = runs.plan(job, run_id)
        if planned != items:
            raise RuntimeError(f"{label}: planned {planned} items, expected {items}")
        for shard in range(SHARDS):
            enqueue_shard(store, peer_lease_jobs.JOB_PATH, name, run_id, shard, 600)
        base = [sys.executable, "-m", "redis_lease", "--url", backend.url]
        base += ["--queue-url", self.rq_url, "--prefix", name]
        flag = ["--concurrency", str(self.concurrency)] if self.sleep_ms > 0 else []
        worker = [*base, "worker", "--simple", "--burst", "--queue", name, *flag]
        commands = [[*worker, "--name", f"{name}-{n}"] for n in range(self.workers)]
        folder = self.folder / label.replace(" ", "-")
        folder.mkdir(exist_ok=True)
        fleet = Fleet(commands, self.env(name), folder)
        shard_keys = [store.keys.shard(run_id, shard) for shard in range(SHARDS)]

        def progress() -> tuple[int, int]:
            # The done counter and the dead index of every shard: the cheapest exact poll.
            pipe = backend.client.pipeline(transaction=False)
            for keys in shard_keys:
                pipe.hget(keys[1], "done")
                pipe.zcard(keys[6])
            replies = pipe.execute()
            return sum(int(r or 0) for r in replies[::2]), sum(int(r) for r in replies[1::2])

        measured = consume(backend, self.rq, fleet, progress, items, label)
        counts = store.status(run_id).counts
        if counts["done"] + counts["dead"] != items or counts["done"] < measured.items:
            raise RuntimeError(f"{label}: the run's status does not add up: {counts}")
        if backend.owner is not None:
            _, by_shard = store.status_by_shard(run_id)
            for shard, keys in enumerate(shard_keys):
                owner = backend.owner(key_slot(keys[0].encode()))
                measured.shards[owner] = measured.shards.get(owner, 0) + 1
                held = sum(by_shard[shard].get(s, 0) for s in ("done", "dead", "pending", "leased"))
                measured.shard_items[owner] = measured.shard_items.get(owner, 0) + held
        return measured


def calibrate(
    nodes: dict[str, redis.Redis], progress: Callable[[], tuple[int, int]]
) -> tuple[dict[str, Usage], dict[str, float]]:
    """What one poll costs each server, and what one ``INFO`` costs it."""
    first = {name: snapshot(c) for name, c in nodes.items()}
    second = {name: snapshot(c) for name, c in nodes.items()}
    for _ in range(CALIBRATION_POLLS):
        progress()
    third = {name: snapshot(c) for name, c in nodes.items()}
    info_cpu = {name: max(0.0, second[name].cpu - first[name].cpu) for name in nodes}
    nothing = Usage(0.0, {})
    polls = {name: usage(second[name], third[name], nothing, 0, info_cpu[name]) for name in nodes}
    per_poll = {
        name: Usage(
            u.cpu / CALIBRATION_POLLS, {k: v / CALIBRATION_POLLS for k, v in u.calls.items()}
        )
        for name, u in polls.items()
    }
    return per_poll, info_cpu


def consume(
    backend: Backend,
    rq: redis.Redis,
    fleet: Fleet,
    progress: Callable[[], tuple[int, int]],
    total: int,
    label: str,
) -> Round:
    """Starts the workers and measures the phase from the first item done to the last."""
    poll, info_cpu = calibrate(backend.nodes, progress)
    first_rq = snapshot(rq)
    rq_info = max(0.0, snapshot(rq).cpu - first_rq.cpu)
    started = time.perf_counter()
    fleet.start()
    try:
        wait_until(fleet, progress, 1, total, started, label)
        before = {name: snapshot(c) for name, c in backend.nodes.items()}
        rq_before = snapshot(rq)
        phase_start = time.perf_counter()
        done0, failed0 = progress()
        failed, polls = failed0, 1
        if done0 + failed0 < total:
            _, failed, more = wait_until(fleet, progress, total, total, started, label)
            polls += more
        phase_seconds = time.perf_counter() - phase_start
        after = {name: snapshot(c) for name, c in backend.nodes.items()}
        rq_after = snapshot(rq)
    finally:
        codes = fleet.wait(30)
    items = total - done0 - failed0
    if items < total // 4:
        raise RuntimeError(
            f"{label}: only {items} of {total} items ended after the first: too few to time"
        )
    if any(codes):
        raise RuntimeError(f"{label}: workers exited {codes}\n{fleet.output()}")
    nodes = {
        name: usage(before[name], after[name], poll[name], polls, info_cpu[name])
        for name in backend.nodes
    }
    return Round(
        backend=backend.name,
        items=items,
        seconds=phase_seconds,
        startup_seconds=phase_start - started,
        nodes=nodes,
        rq=usage(rq_before, rq_after, Usage(0.0, {}), 0, rq_info),
        load_1m=os.getloadavg()[0],
        failed=failed,
        polls=polls,
    )


def wait_until(
    fleet: Fleet,
    progress: Callable[[], tuple[int, int]],
    target: int,
    total: int,
    started: float,
    label: str,
) -> tuple[int, int, int]:
    """Polls every POLL_SECONDS until ``target`` items ended: (done, failed, polls).

    Raises RuntimeError when the workers exit or RUN_TIMEOUT passes first.
    """
    polls = 0
    while True:
        done, failed = progress()
        polls += 1
        if done + failed >= target:
            return done, failed, polls
        elapsed = time.perf_counter() - started
        if elapsed > RUN_TIMEOUT or not fleet.alive():
            done, failed = progress()
            polls += 1
            if done + failed >= target:
                return done, failed, polls
            why = "timed out" if fleet.alive() else "exited"
            raise RuntimeError(
                f"{label}: {done + failed} of {total} ended after {elapsed:.1f}s; "
                f"workers {why}\n{fleet.output()}"
            )
        time.sleep(POLL_SECONDS)


# -- the report -------------------------------------------------------------------


def summarize(rounds: list[Round], planned: int) -> dict[str, Any]:
    """One backend's figures: the medians of its rounds, and each round."""

    def med(values: list[float], places: int) -> float | None:
        found = median(values)
        return None if found is None else round(found, places)

    names = sorted({name for r in rounds for name in r.nodes})
    return {
        "items": planned,
        "items_per_s": med([r.items_per_s for r in rounds], 1),
        "server_us_per_item": med([r.server_us_per_item for r in rounds], 1),
        "node_us_per_item": {
            name: med([r.per_item(r.nodes[name].cpu * 1e6) for r in rounds if name in r.nodes], 1)
            for name in names
        },
        "rq_server_us_per_item": med([r.per_item(r.rq.cpu * 1e6) for r in rounds], 1),
        "scripts_per_item": med([r.scripts_per_item for r in rounds], 3),
        "commands_per_item": med([r.commands_per_item for r in rounds], 2),
        "rounds": [r.to_dict() for r in rounds],
    }


def paired_ratios(one: list[Round], cluster: list[Round]) -> dict[str, Any]:
    """Cluster / one items/s of each round number both sides measured (a round's two runs
    ran one after the other), and their median."""
    ones = {r.number: r.items_per_s for r in one}
    each = {
        str(r.number): ratio(r.items_per_s, ones[r.number]) for r in cluster if r.number in ones
    }
    found = [v for v in each.values() if v is not None]
    return {"items_per_s": each, "median": median(found)}


def spread_summary(rounds: list[Round]) -> dict[str, Any]:
    """The cluster rounds' spread over the primaries: totals over the rounds, and the
    median share of the busiest primary (by script calls and by server CPU) in a round."""
    names = sorted({name for r in rounds for name in r.nodes})
    scripts = {n: sum(r.nodes[n].scripts for r in rounds if n in r.nodes) for n in names}
    cpu = {n: sum(r.nodes[n].cpu for r in rounds if n in r.nodes) for n in names}
    all_scripts, all_cpu = sum(scripts.values()), sum(cpu.values())
    busiest_scripts = [max(s["script_share"] or 0.0 for s in r.spread().values()) for r in rounds]
    busiest_cpu = [max(s["cpu_share"] or 0.0 for s in r.spread().values()) for r in rounds]
    busiest_shards = [max(r.shards.values(), default=0) for r in rounds]
    return {
        "rounds": len(rounds),
        "shards_per_round": SHARDS,
        "per_primary": {
            n: {
                "shards": sum(r.shards.get(n, 0) for r in rounds),
                "items": sum(r.shard_items.get(n, 0) for r in rounds),
                "script_share": round(scripts[n] / all_scripts, 3) if all_scripts else None,
                "cpu_share": round(cpu[n] / all_cpu, 3) if all_cpu else None,
            }
            for n in names
        },
        "busiest_script_share": median(busiest_scripts),
        "busiest_cpu_share": median(busiest_cpu),
        "busiest_shards": median([float(b) for b in busiest_shards]),
    }


def scale_out(
    one_us: float | None,
    cluster_us: float | None,
    busiest_share: float | None,
    one_rate: float | None,
    workers: int,
    nproc: int,
    primaries: int = PRIMARIES,
) -> dict[str, Any]:
    """What the cluster should give on separate machines, by arithmetic.

    With S server µs per item one Redis core saturates near 1e6/S items/s; with
    ``primaries`` primaries on their own machines and the shards spread evenly, near
    ``primaries`` times that; with the cluster's own cost per item (summed over its
    primaries) and the busiest primary's share of the work, 1e6 / (S_cluster x share).
    The workers must keep up: here each of ``workers`` processes did ``one_rate /
    workers`` items/s (sharing the cores with Redis), and a shard is worked by one
    process at a time, so the run needs at least that many shards too.
    """

    def per_core(us: float | None) -> float | None:
        return 1e6 / us if us else None

    one_core = per_core(one_us)
    even = primaries * one_core if one_core else None
    cluster_even = primaries * 1e6 / cluster_us if cluster_us else None
    skewed = 1e6 / (cluster_us * busiest_share) if cluster_us and busiest_share else None
    per_worker = one_rate / workers if one_rate and workers else None
    needed = math.ceil(even / per_worker) if even and per_worker else None
    return {
        "server_us_per_item_one": one_us,
        "one_core_items_per_s": round(one_core) if one_core else None,
        "primaries": primaries,
        "separate_machines_items_per_s": round(even) if even else None,
        "server_us_per_item_cluster": cluster_us,
        "separate_machines_items_per_s_cluster_cost": round(cluster_even) if cluster_even else None,
        "busiest_primary_share": busiest_share,
        "separate_machines_items_per_s_measured_spread": round(skewed) if skewed else None,
        "items_per_s_per_worker_here": round(per_worker, 1) if per_worker else None,
        "workers_needed": needed,
        "shards_needed": needed,
        "caveat": SHARED_CORES.format(nproc=nproc, primaries=primaries),
    }


def arithmetic_lines(math_: dict[str, Any]) -> list[str]:
    """The scale-out arithmetic as printed lines."""
    s, sc, share = (
        math_["server_us_per_item_one"],
        math_["server_us_per_item_cluster"],
        math_["busiest_primary_share"],
    )
    p = math_["primaries"]
    if not s or not math_["one_core_items_per_s"]:
        return ["scale-out arithmetic: no server CPU figure for one node"]
    lines = [
        f"one node: S = {s:.1f} us of server CPU per item -> one Redis core saturates near "
        f"1e6 / {s:.1f} = {math_['one_core_items_per_s']:,} items/s",
        f"{p} primaries on {p} machines, shards spread evenly: ~{p} x "
        f"{math_['one_core_items_per_s']:,} = {math_['separate_machines_items_per_s']:,} items/s",
    ]
    if sc:
        lines.append(
            f"with the cluster's own cost ({sc:.1f} us per item summed over its primaries): "
            f"{p} x 1e6 / {sc:.1f} = "
            f"{math_['separate_machines_items_per_s_cluster_cost']:,} items/s"
        )
    if sc and share:
        lines.append(
            f"with the busiest primary's median share of the script calls in these "
            f"{SHARDS}-shard runs ({share:.3f}, even is {1 / p:.3f}): 1e6 / ({sc:.1f} x "
            f"{share:.3f}) = {math_['separate_machines_items_per_s_measured_spread']:,} items/s"
        )
    if math_["workers_needed"]:
        lines.append(
            f"provided the workers keep up: one worker process did "
            f"{math_['items_per_s_per_worker_here']:,.0f} items/s here, so about "
            f"{math_['workers_needed']} processes on cores of their own (and at least as many "
            f"shards: one process works a shard at a time) for "
            f"{math_['separate_machines_items_per_s']:,} items/s"
        )
    lines.append(math_["caveat"])
    return lines


def build_report(
    measured: dict[str, list[Round]], items: int, context: dict[str, Any]
) -> dict[str, Any]:
    """The JSON report: each backend's figures, their ratio, the spread, the arithmetic."""
    figures = {name: summarize(measured.get(name, []), items) for name in BACKENDS}
    one, cluster = figures["one"], figures["cluster"]
    spread_figures = spread_summary(measured.get("cluster", []))
    report: dict[str, Any] = dict(context)
    report["figures"] = figures
    report["ratio_cluster_over_one"] = {
        "items_per_s": ratio(cluster["items_per_s"], one["items_per_s"]),
        "server_us_per_item": ratio(cluster["server_us_per_item"], one["server_us_per_item"]),
    }
    report["paired_ratios"] = paired_ratios(measured.get("one", []), measured.get("cluster", []))
    report["spread"] = spread_figures
    report["scale_out"] = scale_out(
        one["server_us_per_item"],
        cluster["server_us_per_item"],
        spread_figures["busiest_script_share"],
        one["items_per_s"],
        int(context.get("workers", WORKERS)),
        int(context.get("machine", {}).get("nproc") or os.cpu_count() or 1),
    )
    report["scale_out_lines"] = arithmetic_lines(report["scale_out"])
    return report


def table(report: dict[str, Any]) -> str:
    """The figures, the spread and the arithmetic as Markdown tables and lines."""
    rows = [
        "| lease state on | items | items/s | rounds items/s | server µs/item | per server "
        "µs/item | RQ server µs/item | scripts/item | cmds/item |",
        "|---|---:|---:|---|---:|---|---:|---:|---:|",
    ]
    for name in BACKENDS:
        fig = report["figures"][name]
        rates = " / ".join(f"{r['items_per_s']:,.0f}" for r in fig["rounds"])
        nodes = ", ".join(f"{k} {v}" for k, v in fig["node_us_per_item"].items())
        rate = fig["items_per_s"]
        rows.append(
            f"| {name} | {fig['items']} | {'-' if rate is None else f'{rate:,.0f}'} | {rates} "
            f"| {fig['server_us_per_item']} | {nodes} | {fig['rq_server_us_per_item']} "
            f"| {fig['scripts_per_item']} | {fig['commands_per_item']} |"
        )
    r = report["ratio_cluster_over_one"]
    paired = report["paired_ratios"]
    rows.append(
        f"\nratio cluster / one: items/s {r['items_per_s']}x, "
        f"server µs/item {r['server_us_per_item']}x; items/s round by round "
        f"{' / '.join(f'{v}x' for v in paired['items_per_s'].values())} "
        f"(median {paired['median']}x)"
    )
    spread_ = report["spread"]
    rows += [
        f"\nspread over the primaries ({spread_['rounds']} cluster rounds of "
        f"{spread_['shards_per_round']} shards; totals over the rounds):\n",
        "| primary | port | shards | items | share of script calls | share of server CPU |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    ports = report.get("ports", {})
    for name, row in spread_["per_primary"].items():
        rows.append(
            f"| {name} | {ports.get(name, '')} | {row['shards']} | {row['items']} "
            f"| {row['script_share']} | {row['cpu_share']} |"
        )
    rows.append(
        f"\nbusiest primary per round (median): {spread_['busiest_shards']} of {SHARDS} shards, "
        f"script share {spread_['busiest_script_share']}, CPU share {spread_['busiest_cpu_share']}"
    )
    rows += ["", *report["scale_out_lines"]]
    load = report.get("load_average", {})
    rows.append(f"\n1-minute load average: start {load.get('start')}, end {load.get('end')}")
    return "\n".join(rows)


# -- the command line ---------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer items and rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per backend")
    parser.add_argument("--items", type=int, default=None, help="items per round")
    parser.add_argument("--workers", type=int, default=WORKERS, help="worker processes")
    parser.add_argument(
        "--warmup",
        type=int,
        default=WARMUP_ITEMS,
        help=f"items of each side's warm-up run, not reported (default {WARMUP_ITEMS}; 0: none)",
    )
    parser.add_argument(
        "--handler-ms", type=float, default=0.0, help="the handler's sleep (0: a no-op)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=16, help="items in flight per worker with a sleep"
    )
    args = parser.parse_args(argv)
    if args.rounds is not None and not 1 <= args.rounds <= 50:
        parser.error("--rounds must be from 1 to 50")
    if args.items is not None and not SHARDS <= args.items <= 1_000_000:
        parser.error(f"--items must be from {SHARDS} to 1000000")
    if not 1 <= args.workers <= 32:
        parser.error("--workers must be from 1 to 32")
    if not 0 <= args.warmup <= 100_000:
        parser.error("--warmup must be from 0 to 100000")
    if not 0 <= args.handler_ms <= 1000 or not 1 <= args.concurrency <= 256:
        parser.error("--handler-ms must be from 0 to 1000, --concurrency from 1 to 256")
    return args


def backends(one: RedisServer, cluster: ClusterServers) -> list[Backend]:
    """The lease state on one server, and on the cluster."""
    names = {port: f"primary-{i + 1}" for i, port in enumerate(cluster.ports)}
    owners: dict[int, str] = {}

    def owner(slot: int) -> str:
        if slot not in owners:  # the slots do not move during the benchmark
            owners[slot] = names[cluster.slot_owner(slot)]
        return owners[slot]

    def plain(port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)

    return [
        Backend(
            "one", one.url, client_from_url(one.url), {"one": plain(one.port)}, {"one": one.port}
        ),
        Backend(
            "cluster",
            cluster.url,
            client_from_url(cluster.url),
            {name: plain(port) for port, name in names.items()},
            {name: port for port, name in names.items()},
            owner,
        ),
    ]


def measure_all(
    harness: Harness, sides: list[Backend], items: int, rounds: int, warmup: int
) -> tuple[dict[str, list[Round]], dict[str, str]]:
    """A warm-up of each side (``warmup`` items), then ``rounds`` rounds of one, cluster,
    one, cluster, ...

    Returns the rounds of each side and the rounds that failed (label: first line).
    """
    for side in sides if warmup else []:
        log(f"warm-up: {side.name}, {warmup} items (not reported)")
        harness.run(side, warmup, f"warm-up {side.name}")
    measured: dict[str, list[Round]] = {side.name: [] for side in sides}
    failures: dict[str, str] = {}
    for number in range(1, rounds + 1):
        for side in sides:
            label = f"round {number} {side.name}"
            try:
                result = harness.run(side, items, label)
            except RuntimeError as error:
                failures[label] = str(error).splitlines()[0]
                log(f"{label}: FAILED: {failures[label]}")
                continue
            result.number = number
            measured[side.name].append(result)
            log(
                f"{label}: {result.items} items in {result.seconds:.2f}s = "
                f"{result.items_per_s:,.0f}/s, {result.server_us_per_item:.1f} server us/item "
                f"(load {result.load_1m:.2f})"
            )
    return measured, failures


def main(argv: list[str] | None = None) -> int:
    """Measures both sides and prints the table or the JSON object."""
    args = parse_args(argv)
    started = time.perf_counter()
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        print(f"cluster.py needs {' and '.join(missing)}: apt-get install redis", file=sys.stderr)
        return 2
    mode = "quick" if args.quick else "full"
    rounds = args.rounds or ROUNDS[mode]
    items = args.items or ITEMS[mode]
    concurrency = args.concurrency if args.handler_ms > 0 else 1
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as temp:
        folder = Path(temp)
        servers = {name: folder / name for name in ("rq", "one", "cluster")}
        for path in servers.values():
            path.mkdir()
        rq_server, one_server = RedisServer(servers["rq"]), RedisServer(servers["one"])
        cluster = ClusterServers(servers["cluster"], PRIMARIES)
        try:
            rq_server.start()
            one_server.start()
            cluster.start()
            rq = redis.Redis.from_url(rq_server.url, socket_timeout=60)
            sides = backends(one_server, cluster)
            harness = Harness(rq_server.url, rq, folder, args.workers, args.handler_ms, concurrency)
            log(
                f"{mode} mode: {rounds} rounds of {items} items over {SHARDS} shards, "
                f"{args.workers} workers; RQ on :{rq_server.port}, one on :{one_server.port}, "
                f"cluster on {','.join(str(p) for p in cluster.ports)}"
            )
            measured, failures = measure_all(harness, sides, items, rounds, args.warmup)
            info = machine(rq)
            ports = {name: port for side in sides for name, port in side.ports.items()}
            for side in sides:
                side.client.close()
                for node in side.nodes.values():
                    node.close()
            rq.close()
        finally:
            cluster.stop()
            one_server.stop()
            rq_server.stop()
    context = {
        "mode": mode,
        "machine": info,
        "load_average": {
            "start": [round(x, 2) for x in _LOAD_AT_START],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
        "workers": args.workers,
        "shards": SHARDS,
        "batch_size": BATCH,
        "handler_ms": args.handler_ms,
        "concurrency": concurrency,
        "rounds": rounds,
        "warmup_items": args.warmup,
        "ports": ports,
        "failures": failures,
        "seconds": round(time.perf_counter() - started, 1),
    }
    report = build_report(measured, items, context)
    if args.json:
        print(json.dumps(report))
    else:
        print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
