"""What waiting for a replica costs a claim: claims per second with and without ``wait_replicas``.

One private primary and one replica (``tests/redis_server.py``: free loopback ports,
temporary directories, ``--save '' --appendonly no``), on this machine. Two stores on the
primary, from one process: the default one, and one made with ``?wait_replicas=1``
(``wait_timeout_ms=1000``), whose every claim is followed by ``WAIT 1 1000`` in the same
round trip. Each round adds a fresh run of ``--items`` items in one shard and claims them
all, either one per call (``claim_next(limit=1)``: a worker whose handlers are slow) or
``--batch`` per call (``claim_next(limit=batch)``: a worker's usual claim); the claims
alone are timed, each call on its own. Rounds alternate the two stores (A B, then B A) and
are short, so that a load that comes and goes meets both sides alike. The figures are
medians: of the rounds' claims per second, and of every call's time; the ratios are
measured against the default store in the same run. The 1-minute load average is taken at
the start and the end.

The replica is on the same machine, so a WAIT costs what the replica takes to apply the
claim and acknowledge it on loopback; across a network add a round trip to the replica.

Usage::

    python benchmarks/replica_wait.py [--rounds 40] [--items 300] [--batch 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from redis_lease import Item, LeaseStore  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402

SIDES = ("default", "wait_replicas=1")
_LOAD_AT_START = os.getloadavg()[0]


def log(message: str) -> None:
    """Progress on stderr, so that ``--json`` output stays clean."""
    print(message, file=sys.stderr, flush=True)


def start_pair(folder: Path) -> tuple[RedisServer, RedisServer]:
    """A primary and a replica that acknowledges the primary's writes."""
    servers = []
    for name in ("primary", "replica"):
        (folder / name).mkdir()
        server = RedisServer(folder / name, {"repl-diskless-sync-delay": "0"})
        server.start()
        servers.append(server)
    primary, replica = servers
    redis.Redis(port=replica.port).execute_command("REPLICAOF", "127.0.0.1", primary.port)
    client = redis.Redis(port=primary.port)
    deadline = time.monotonic() + 30
    while True:  # a write the replica acknowledges: its command stream flows
        client.set("probe", 1)
        if int(client.execute_command("WAIT", 1, 100)) >= 1:
            break
        if time.monotonic() > deadline:
            raise RuntimeError("the replica did not acknowledge within 30 s")
    client.close()
    return primary, replica


def one_round(store: LeaseStore, run_id: str, items: int, limit: int) -> tuple[float, list[float]]:
    """Claims every item of a fresh run, ``limit`` per call; returns claims per second and
    each call's seconds."""
    store.add(run_id, [Item(f"i{n}") for n in range(items)], shards=1)
    claimed = 0
    calls = []
    for _ in range(-(-items // limit)):
        started = time.perf_counter()
        got = len(store.claim_next(run_id, "bench", shard=0, limit=limit, ttl=600))
        calls.append(time.perf_counter() - started)
        if not got:
            raise RuntimeError(f"run {run_id} drained at {claimed} of {items}")
        claimed += got
    return claimed / sum(calls), calls


def measure(
    stores: dict[str, LeaseStore], rounds: int, items: int, limit: int, label: str
) -> dict[str, tuple[list[float], list[float]]]:
    """Interleaved rounds (A B, B A, ...), one warm-up round per side first; per side, the
    rounds' claims per second and every call's seconds."""
    found: dict[str, tuple[list[float], list[float]]] = {side: ([], []) for side in SIDES}
    for side in SIDES:
        one_round(stores[side], f"warm-{label}-{side}", min(items, 200), limit)
    for number in range(rounds):
        order = SIDES if number % 2 == 0 else tuple(reversed(SIDES))
        for side in order:
            rate, calls = one_round(stores[side], f"{label}-{number}-{side}", items, limit)
            found[side][0].append(rate)
            found[side][1].extend(calls)
        if (number + 1) % 10 == 0:
            log(f"{label}: {number + 1}/{rounds} rounds")
    return found


def summary(found: dict[str, tuple[list[float], list[float]]]) -> dict[str, Any]:
    """Medians per side (claims per second over the rounds, µs per call over every call)
    and the waiting store's ratios to the default one."""
    rates = {side: statistics.median(found[side][0]) for side in SIDES}
    call_us = {side: statistics.median(found[side][1]) * 1e6 for side in SIDES}
    return {
        "claims_per_s": {side: round(value, 1) for side, value in rates.items()},
        "ratio": round(rates[SIDES[1]] / rates[SIDES[0]], 3),
        "call_us": {side: round(value, 1) for side, value in call_us.items()},
        "call_ratio": round(call_us[SIDES[1]] / call_us[SIDES[0]], 3),
        "rounds": {side: [round(v, 1) for v in found[side][0]] for side in SIDES},
    }


def main() -> None:
    """Runs the benchmark and prints a Markdown table (or JSON with ``--json``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--items", type=int, default=300)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="replica-wait-") as scratch:
        primary, replica = start_pair(Path(scratch))
        try:
            stores = {
                SIDES[0]: LeaseStore.from_url(primary.url, prefix="bench"),
                SIDES[1]: LeaseStore.from_url(
                    f"{primary.url}?wait_replicas=1&wait_timeout_ms=1000", prefix="bench"
                ),
            }
            results = {
                "one per claim": summary(measure(stores, options.rounds, options.items, 1, "one")),
                f"{options.batch} per claim": summary(
                    measure(stores, options.rounds, options.items, options.batch, "batch")
                ),
            }
            server = redis.Redis(port=primary.port).info("server")
            for store in stores.values():
                store.close()
        finally:
            primary.kill()
            replica.kill()
    report: dict[str, Any] = {
        "results": results,
        "rounds": options.rounds,
        "items": options.items,
        "load_1m": {"start": _LOAD_AT_START, "end": os.getloadavg()[0]},
        "machine": {
            "nproc": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "redis_server": server.get("redis_version"),
            "redis_py": redis.__version__,
        },
    }
    if options.json:
        print(json.dumps(report, indent=2))
        return
    print_table(report, print)


def print_table(report: dict[str, Any], out: Callable[[str], None]) -> None:
    """The medians as a Markdown table, with the load average."""
    out(
        "| claims | default claims/s | wait_replicas=1 claims/s | ratio "
        "| default µs/call | wait_replicas=1 µs/call | ratio |"
    )
    out("|---|---:|---:|---:|---:|---:|---:|")
    for name, fig in report["results"].items():
        rates, calls = fig["claims_per_s"], fig["call_us"]
        out(
            f"| {name} | {rates[SIDES[0]]:,.0f} | {rates[SIDES[1]]:,.0f} | {fig['ratio']:.2f}x "
            f"| {calls[SIDES[0]]:,.0f} | {calls[SIDES[1]]:,.0f} | {fig['call_ratio']:.2f}x |"
        )
    load = report["load_1m"]
    out(f"\n{report['rounds']} interleaved rounds of {report['items']} items per side; medians.")
    out(f"1-minute load average: {load['start']:.2f} at the start, {load['end']:.2f} at the end.")


if __name__ == "__main__":
    main()
