"""Server CPU of an effect's two ledger calls, against another revision's scripts.

An effect costs two ``record_effect`` calls: the intent (``ARGV[8]='1'``; in this revision it
also renews the lease, ``ARGV[11]``, and reads the shard's ``after_loss`` mark when the
effect has no record) and the outcome (``applied``). This measures the server's usec per
call of each (``INFO commandstats``) over N claimed items of a fresh shard, in interleaved
rounds (the reference's scripts, then this revision's, and so on), and prints the medians,
the ratio current/reference and the load average.

    git archive main | tar -x -C /tmp/ref        # the reference revision, whole
    python benchmarks/bench_effect_begin.py --ref /tmp/ref            # a private redis-server
    python benchmarks/bench_effect_begin.py --ref /tmp/ref --url redis://127.0.0.1:6399/0
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.bench_fleet import redis_for
from redis_lease.protocol.scripts import source

SHARD_KEYS = ("meta", "counts", "items", "due", "leases", "held", "dead", "attempts")
NAMES = ("add_items", "claim", "record_effect")
TTL_MS = 600_000


def reference(checkout: Path) -> Callable[[str], str]:
    """A function giving the scripts of another checkout, as that revision builds them."""

    def build(name: str) -> str:
        code = f"from redis_lease.protocol.scripts import source; print(source({name!r}), end='')"
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONPATH": str(checkout)},
            cwd=checkout,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout

    return build


def _usec(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def measure(
    client: redis.Redis, src: Callable[[str], str], n: int, renew: bool
) -> dict[str, float]:
    """Server usec per intent call and per outcome call over ``n`` claimed items."""
    sha = {name: client.script_load(src(name)) for name in NAMES}
    prefix = f"bench-effect-{uuid.uuid4().hex[:8]}"
    keys = [f"{prefix}:{{r#0}}:{name}" for name in SHARD_KEYS]
    effects = [f"{prefix}:{{r#0}}:effects", f"{prefix}:{{r#0}}:effects_unknown"]
    ids = [f"i{i}" for i in range(n)]
    for start in range(0, n, 500):
        flat = [part for item in ids[start : start + 500] for part in (item, "{}")]
        client.evalsha(sha["add_items"], 7, *keys[:7], "r", 0, 5, 1000, 300000, 0, *flat)
    rows = [client.evalsha(sha["claim"], 8, *keys, i, "w", uuid.uuid4().hex, TTL_MS) for i in ids]
    trace = uuid.uuid4().hex
    ttl = [TTL_MS] if renew else []
    before = _usec(client)
    for row in rows:
        args = (row[0], int(row[1]), row[2], f"r|{row[0]}|pay", "pay", "intended", "null", "1")
        client.evalsha(sha["record_effect"], 10, *keys, *effects, *args, "", trace, *ttl)
    intended = _usec(client)
    for row in rows:
        args = (row[0], int(row[1]), row[2], f"r|{row[0]}|pay", "pay", "applied", '{"id":1}')
        client.evalsha(sha["record_effect"], 10, *keys, *effects, *args, "", "", trace)
    applied = _usec(client)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    return {
        "intent": (intended[1] - before[1]) / (intended[0] - before[0]),
        "outcome": (applied[1] - intended[1]) / (applied[0] - intended[0]),
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the interleaved rounds and prints the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", type=Path, required=True, help="a checkout of the reference")
    parser.add_argument("--url", help="a Redis nothing else uses (default: a private one)")
    parser.add_argument("-n", type=int, default=2000, help="items per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    variants: dict[str, tuple[Callable[[str], str], bool]] = {
        "reference": (reference(args.ref), False),
        "current": (source, True),
    }
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as folder, redis_for(args.url, Path(folder)) as (url, kind):
        client = redis.Redis.from_url(url)
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for _ in range(args.rounds):
            for name, (src, renew) in variants.items():
                results[name].append(measure(client, src, args.n, renew))
        print(f"redis: {kind}; {args.n} items, {args.rounds} interleaved rounds")
        medians = {
            name: {part: statistics.median(r[part] for r in rows) for part in ("intent", "outcome")}
            for name, rows in results.items()
        }
        for name, parts in medians.items():
            total = parts["intent"] + parts["outcome"]
            print(
                f"{name:9}  intent {parts['intent']:6.2f} us  outcome {parts['outcome']:6.2f} us"
                f"  effect {total:6.2f} us"
            )
        ref, cur = medians["reference"], medians["current"]
        ratio = (cur["intent"] + cur["outcome"]) / (ref["intent"] + ref["outcome"])
        print(f"current / reference, per effect: {ratio:.2f}")
    print(f"1-minute load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
