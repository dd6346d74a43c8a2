"""What ``LeaseStore.status`` of a run costs the server: commands, script calls, CPU.

Dashboards, exporters and the tick poll the status of every open run, so its cost
per shard matters. The benchmark adds ``--items`` items over ``--shards`` shards,
leases some, then calls ``status`` ``--calls`` times per round and reads the
server's counters (``INFO``) around each round: commands, script calls and
``used_cpu_user + used_cpu_sys`` per status call. Medians over ``--rounds``.

Usage::

    python benchmarks/bench_status.py [--url URL] [--shards 8] [--json]

Without ``--url`` (or ``REDIS_URL``) it starts a private ``redis-server`` on a free
loopback port (as ``bench_fleet.py`` does), so that no other client's commands are
counted. Every key lives under a fresh prefix and is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_fleet import redis_for
from redis_lease import Item, LeaseStore


def counters(client: redis.Redis) -> tuple[int, int, float]:
    """(commands processed, script calls, server CPU seconds) now."""
    info: dict[str, Any] = client.info("everything")
    scripts = sum(info.get(f"cmdstat_{n}", {}).get("calls", 0) for n in ("evalsha", "eval"))
    cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return int(info["total_commands_processed"]), scripts, cpu


def measure(url: str, shards: int, items: int, calls: int, rounds: int) -> dict[str, Any]:
    """The median cost of one status call over ``rounds`` rounds of ``calls`` calls."""
    client = redis.Redis.from_url(url)
    store = LeaseStore(client, prefix=f"status-{uuid.uuid4().hex[:8]}")
    try:
        store.add("r", [Item(f"i{n}", {"n": n}) for n in range(items)], shards=shards)
        store.claim_next("r", "w", limit=min(100, items))
        store.status("r")  # warm
        per_round = []
        for _ in range(rounds):
            before = counters(client)
            for _ in range(calls):
                store.status("r")
            after = counters(client)
            per_round.append(
                (
                    (after[0] - before[0] - 1) / calls,  # less the INFO of `after`
                    (after[1] - before[1]) / calls,
                    (after[2] - before[2]) * 1e6 / calls,
                )
            )
    finally:
        keys = list(client.scan_iter(match=f"{store.prefix}:*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
        client.close()
    commands, scripts, cpu = (statistics.median(r[i] for r in per_round) for i in range(3))
    return {
        "shards": shards,
        "commands_per_status": round(commands, 1),
        "script_calls_per_status": round(scripts, 2),
        "server_us_per_status": round(cpu, 1),
        "server_us_per_shard": round(cpu / shards, 1),
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("REDIS_URL"), help="default: private")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--items", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=300, help="status calls per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, redis_for(args.url, Path(folder)) as (url, _):
        result = measure(url, args.shards, args.items, args.calls, args.rounds)
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"status of a {result['shards']}-shard run: {result['commands_per_status']} commands,"
            f" {result['script_calls_per_status']} script calls,"
            f" {result['server_us_per_status']} us of server CPU"
            f" ({result['server_us_per_shard']} us per shard); load {result['load_average_1m']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
