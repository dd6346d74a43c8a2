"""Server CPU per claim and per commit script call, against another revision's scripts.

Reads ``INFO commandstats`` (EVALSHA usec / calls) around N named claims and then
N commits, on a Redis that nothing else uses (start a private one), and repeats
the measure in interleaved rounds: the reference revision's scripts, then the
current ones, and so on. Prints the median of each and the current/reference
ratio, with the load average.

    git worktree add /tmp/ref <rev>      # or: git archive <rev> | tar -x -C /tmp/ref
    redis-server --port 6399 --save '' --appendonly no --daemonize yes
    python benchmarks/bench_script_cpu.py --url redis://127.0.0.1:6399/0 --ref /tmp/ref
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from redis_lease.scripts import source

KEY_NAMES = ("meta", "counts", "items", "due", "leases", "held", "dead")
PAYLOAD = '{"account":42,"cursor":9}'
RESULT = '{"reference":"pay_123"}'
_INCLUDE = re.compile(r'^-- @include "([a-z_]+\.lua)"$', re.MULTILINE)


def reference_source(checkout: Path) -> Callable[[str], str]:
    """The scripts of another checkout, includes expanded (its own expander when it has one)."""
    folder = checkout / "lua"

    def expand(name: str) -> str:
        text = (folder / f"{name}.lua").read_text()
        return _INCLUDE.sub(lambda m: (folder / "include" / m.group(1)).read_text(), text)

    return expand


def _usec(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def measure(
    client: redis.Redis, src: Callable[[str], str], with_deadline: bool, n: int
) -> dict[str, float]:
    """Server usec per claim call and per commit call over ``n`` items on a fresh shard."""
    sha = {name: client.script_load(src(name)) for name in ("add_items", "claim", "commit")}
    prefix = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}:{{r#0}}:{name}" for name in KEY_NAMES]
    ids = [f"i{i}" for i in range(n)]
    settings = ["r", 0, 5, 1000, 300000, *([0] if with_deadline else [])]
    for start in range(0, n, 500):
        flat = [part for item in ids[start : start + 500] for part in (item, PAYLOAD)]
        client.evalsha(sha["add_items"], 7, *keys, *settings, *flat)
    before = _usec(client)
    rows = [client.evalsha(sha["claim"], 7, *keys, i, "w", uuid.uuid4().hex, 600000) for i in ids]
    claimed = _usec(client)
    for row in rows:
        client.evalsha(sha["commit"], 7, *keys, row[0], int(row[1]), row[2], RESULT, "[]", "[]", "")
    committed = _usec(client)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    return {
        "claim": (claimed[1] - before[1]) / (claimed[0] - before[0]),
        "commit": (committed[1] - claimed[1]) / (committed[0] - claimed[0]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the interleaved rounds and prints the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a Redis nothing else uses")
    parser.add_argument("--ref", type=Path, required=True, help="a checkout of the reference")
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    client = redis.Redis.from_url(args.url)
    ref_src = reference_source(args.ref)
    ref_deadline = "deadline" in (args.ref / "lua" / "add_items.lua").read_text()
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {"reference": [], "current": []}
    for _ in range(args.rounds):
        runs["reference"].append(measure(client, ref_src, ref_deadline, args.items))
        runs["current"].append(measure(client, source, True, args.items))
    medians = {
        kind: {op: statistics.median(r[op] for r in rounds) for op in ("claim", "commit")}
        for kind, rounds in runs.items()
    }
    print(
        f"server usec per script call, median of {args.rounds} interleaved rounds of {args.items}"
    )
    for op in ("claim", "commit"):
        ref, cur = medians["reference"][op], medians["current"][op]
        print(f"{op:<7} reference {ref:6.1f} us   current {cur:6.1f} us   {cur / ref:.2f}x")
    print(f"1-minute load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
