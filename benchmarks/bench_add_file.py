"""``redis-lease add RUN --from-file FILE``: items/s of this checkout against another's.

Writes a JSON-lines file of N items once (ids ``acct_0000042:cursor_6:2026-12-01``,
payloads ``{"account": 42, "cursor": 6}``), then runs the command line of the reference
checkout and of this one on it in interleaved rounds (reference, current, reference, ...),
each into a fresh key prefix of a Redis nothing else uses, and prints the median items/s
of each, their ratio, the server CPU per item and the load average. Every run must report
every item added; ``--again`` also times adding the same file a second time (every item
already there).

    git worktree add /tmp/ref <rev>      # or: git archive <rev> | tar -x -C /tmp/ref
    redis-server --port 6399 --save '' --appendonly no --daemonize yes
    python benchmarks/bench_add_file.py --url redis://127.0.0.1:6399/0 --ref /tmp/ref
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import redis

HERE = Path(__file__).resolve().parent.parent


def write_items(path: Path, count: int) -> None:
    """A JSON-lines file of ``count`` items."""
    with path.open("w") as out:
        for i in range(count):
            line = {
                "id": f"acct_{i:07d}:cursor_{i % 9}:2026-12-01",
                "payload": {"account": i, "cursor": i % 9},
            }
            out.write(json.dumps(line) + "\n")


def cpu_us(client: redis.Redis) -> float:
    """The server's CPU time so far (user + system), in microseconds."""
    info = client.info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6


def add_file(
    checkout: Path, url: str, prefix: str, path: Path, shards: int, client: redis.Redis
) -> dict[str, float]:
    """Runs ``add --from-file`` of ``checkout``; its wall seconds, server CPU and counts."""
    command = [sys.executable, "-m", "redis_lease", "--url", url, "--prefix", prefix, "add",
               "bench:2026-12-01", "--from-file", str(path), "--shards", str(shards),
               "--json"]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cpu, started = cpu_us(client), time.perf_counter()
    done = subprocess.run(command, cwd=checkout, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: exit {done.returncode}: {done.stderr.strip()}")
    reply = json.loads(done.stdout)
    return {"seconds": seconds, "cpu_us": cpu_us(client) - cpu, "added": reply["added"],
            "existing": reply["existing"]}  # fmt: skip


def drop(client: redis.Redis, prefix: str) -> None:
    """Deletes every key under ``prefix``."""
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    for start in range(0, len(keys), 500):
        client.unlink(*keys[start : start + 500])


def main(argv: list[str] | None = None) -> int:
    """Runs the interleaved rounds and prints the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a Redis nothing else uses")
    parser.add_argument("--ref", type=Path, required=True, help="a checkout of the reference")
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--again", action="store_true", help="also add the same file again")
    args = parser.parse_args(argv)
    if args.items < 1 or args.rounds < 1:
        parser.error("--items and --rounds must be at least 1")
    client = redis.Redis.from_url(args.url)
    checkouts = {"reference": args.ref.resolve(), "current": HERE}
    runs: dict[str, list[dict[str, float]]] = {"reference": [], "current": []}
    again: dict[str, list[dict[str, float]]] = {"reference": [], "current": []}
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "items.jsonl"
        write_items(path, args.items)
        load_start = os.getloadavg()
        for round_ in range(args.rounds):
            for kind, checkout in checkouts.items():
                prefix = f"bench-add-{uuid.uuid4().hex[:8]}"
                run = add_file(checkout, args.url, prefix, path, args.shards, client)
                if run["added"] != args.items:
                    raise SystemExit(f"{kind}: {run['added']} of {args.items} items added")
                runs[kind].append(run)
                line = f"round {round_ + 1} {kind:<9} {args.items / run['seconds']:9,.0f} items/s"
                if args.again:
                    second = add_file(checkout, args.url, prefix, path, args.shards, client)
                    if second["existing"] != args.items:
                        raise SystemExit(f"{kind}: {second['existing']} items already there")
                    again[kind].append(second)
                    line += f", again {args.items / second['seconds']:9,.0f} items/s"
                print(line + f"  (load {os.getloadavg()[0]:.2f})", flush=True)
                drop(client, prefix)
        load_end = os.getloadavg()

    def rate(found: list[dict[str, float]]) -> float:
        return statistics.median(args.items / r["seconds"] for r in found)

    def cpu(found: list[dict[str, float]]) -> float:
        return statistics.median(r["cpu_us"] / args.items for r in found)

    print(
        f"add --from-file of {args.items:,} items into {args.shards} shards, "
        f"median of {args.rounds} interleaved rounds"
    )
    for title, found in (("add", runs), ("add again", again)):
        if not found["current"]:
            continue
        ref, cur = rate(found["reference"]), rate(found["current"])
        print(
            f"{title:<9} reference {ref:9,.0f} items/s ({cpu(found['reference']):5.1f} us server "
            f"CPU/item)   current {cur:9,.0f} items/s ({cpu(found['current']):5.1f} us)   "
            f"{cur / ref:.2f}x"
        )
    print(f"load average (1, 5, 15 min) at start {load_start} / end {load_end}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
