"""Server CPU per claim and per commit script call, against another revision's scripts;
and (``--records``) the cost of each form an item record could take.

Reads ``INFO commandstats`` (EVALSHA usec / calls) around N named claims and then
N commits, on a Redis that nothing else uses (start a private one), and repeats
the measure in interleaved rounds: the reference revision's scripts, then the
current ones, and so on. Prints the median of each and the current/reference
ratio, with the load average.

    git worktree add /tmp/ref <rev>      # or: git archive <rev> | tar -x -C /tmp/ref
    redis-server --port 6399 --save '' --appendonly no --daemonize yes
    python benchmarks/bench_script_cpu.py --url redis://127.0.0.1:6399/0 --ref /tmp/ref
    python benchmarks/bench_script_cpu.py --url redis://127.0.0.1:6399/0 --ref /tmp/ref --batched
    python benchmarks/bench_script_cpu.py --url redis://127.0.0.1:6399/0 --records

``--batched`` times what a fleet sends instead: ``claim_next`` of ``--batch`` items a call
(20 by default), then one ``settle`` of each batch's commits (result ``null``), as server
CPU (``used_cpu_user`` + ``used_cpu_sys``) per item, so the call's own cost is shared as
in a fleet. With ``--alternate`` each batch is settled before the next claim, as a worker
does, so the lease indexes stay small (Redis keeps a small sorted set as a listpack, whose
inserts and removals walk it from its head); it prints one figure, claim and settle
together.

``--records`` times, in interleaved rounds, one read-change-write of N item records
inside one script call (what a claim or a commit does to each item) in each form:
``json`` (a JSON object with the payload as escaped text inside, decoded and encoded
on every change, the earlier form), ``hash`` (a hash per item, HMGET and HSET of its
fields) and ``packed`` (the fields joined by ``|`` in one hash field, the payload raw
at its end: copied, never decoded). It reports server CPU (``used_cpu_user`` + ``used_cpu_sys``)
per item and the ``used_memory`` growth per stored item.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import redis

from redis_lease.protocol.scripts import source

KEY_NAMES = ("meta", "counts", "items", "due", "leases", "held", "dead")
PAYLOAD = '{"account":42,"cursor":9}'
RESULT = '{"reference":"pay_123"}'
_INCLUDE = re.compile(r'^-- @include "([a-z_]+\.lua)"$', re.MULTILINE)


def reference_source(checkout: Path) -> Callable[[str], str]:
    """The scripts of another checkout, includes expanded (its own expander when it has one)."""
    folder = checkout / "lua"
    if (checkout / "redis_lease" / "scripts.py").is_file():

        def own(name: str) -> str:  # nested includes and LIMITS, as that revision builds them
            code = f"from redis_lease import source; print(source({name!r}), end='')"
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            # Run in the checkout: ``python -c`` puts the working directory first on sys.path.
            found = subprocess.run(
                [sys.executable, "-c", code],
                env=env,
                cwd=checkout,
                capture_output=True,
                text=True,
                check=True,
            )
            return found.stdout

        return own

    def expand(name: str) -> str:
        text = (folder / f"{name}.lua").read_text()
        return _INCLUDE.sub(lambda m: (folder / "include" / m.group(1)).read_text(), text)

    return expand


def _keys(src: Callable[[str], str], prefix: str) -> tuple[list[str], list[str]]:
    """The shard keys of a revision's claim, commit and settle calls (with the attempt log
    when its scripts take one) and the trace id argument each holder call ends with."""
    logged = "KEYS[8] attempts" in src("settle")
    names = (*KEY_NAMES, "attempts") if logged else KEY_NAMES
    return [f"{prefix}:{{r#0}}:{name}" for name in names], [uuid.uuid4().hex] if logged else []


def _usec(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def measure(
    client: redis.Redis, src: Callable[[str], str], with_deadline: bool, n: int
) -> dict[str, float]:
    """Server usec per claim call and per commit call over ``n`` items on a fresh shard."""
    sha = {name: client.script_load(src(name)) for name in ("add_items", "claim", "commit")}
    prefix = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    keys, trace = _keys(src, prefix)
    ids = [f"i{i}" for i in range(n)]
    settings = ["r", 0, 5, 1000, 300000, *([0] if with_deadline else [])]
    for start in range(0, n, 500):
        flat = [part for item in ids[start : start + 500] for part in (item, PAYLOAD)]
        client.evalsha(sha["add_items"], 7, *keys[:7], *settings, *flat)
    before = _usec(client)
    k = len(keys)
    rows = [client.evalsha(sha["claim"], k, *keys, i, "w", uuid.uuid4().hex, 600000) for i in ids]
    claimed = _usec(client)
    for row in rows:
        args = (row[0], int(row[1]), row[2], RESULT, "[]", "[]", "", *trace)
        client.evalsha(sha["commit"], k, *keys, *args)
    committed = _usec(client)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    return {
        "claim": (claimed[1] - before[1]) / (claimed[0] - before[0]),
        "commit": (committed[1] - claimed[1]) / (committed[0] - claimed[0]),
    }


def _shard_of(
    client: redis.Redis, src: Callable[[str], str], ids: Sequence[str]
) -> tuple[dict[str, str], str, list[str], list[str]]:
    """A fresh shard holding ``ids`` (due now): the scripts' SHAs, the key prefix, the shard's
    keys and the trace id argument."""
    sha = {name: client.script_load(src(name)) for name in ("add_items", "claim_next", "settle")}
    prefix = f"bench-cpu-{uuid.uuid4().hex[:8]}"
    keys, trace = _keys(src, prefix)
    for start in range(0, len(ids), 500):
        flat = [part for item in ids[start : start + 500] for part in (item, PAYLOAD)]
        client.evalsha(sha["add_items"], 7, *keys[:7], "r", 0, 5, 1000, 300000, 0, *flat)
    return sha, prefix, keys, trace


def measure_batched(
    client: redis.Redis, src: Callable[[str], str], n: int, batch: int = 20
) -> dict[str, float]:
    """Server CPU per item of claim_next (``batch`` a call) and of settle (one call a batch)."""
    sha, prefix, keys, trace = _shard_of(client, src, [f"item-{i:07d}" for i in range(n)])
    k = len(keys)
    before = _cpu_us(client)
    batches = [
        client.evalsha(sha["claim_next"], k, *keys, "w", uuid.uuid4().hex, 600000, batch)
        for _ in range(n // batch)
    ]
    claimed = _cpu_us(client)
    for rows in batches:
        traced = [uuid.uuid4().hex] if trace else []  # one a batch: the server cost is the same
        flat = [
            part for r in rows for part in ("commit", r[0], int(r[1]), r[2], "null", "", *traced)
        ]
        client.evalsha(sha["settle"], k, *keys, *flat)
    settled = _cpu_us(client)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    return {"claim": (claimed - before) / n, "commit": (settled - claimed) / n}


def measure_alternating(
    client: redis.Redis, src: Callable[[str], str], n: int, batch: int = 20, base: int = 16
) -> dict[str, float]:
    """Server CPU per item of ``claim_next`` of ``batch`` then one ``settle`` of that batch's
    commits, again and again, as a worker does: the lease indexes stay small (a listpack),
    where claiming everything first makes them large (a skiplist). ``base``: the length of
    the lease ids' base, in hex characters."""
    ids = [f"acct_{i:07d}:cursor_{i % 3}:2026-12-01" for i in range(n)]
    sha, prefix, keys, trace = _shard_of(client, src, ids)
    k = len(keys)
    rounds = n // batch
    before = _cpu_us(client)
    for _ in range(rounds):
        rows = client.evalsha(
            sha["claim_next"], k, *keys, "w", uuid.uuid4().hex[:base], 600000, batch
        )
        flat = [
            part
            for r in rows
            for part in (
                "commit",
                r[0],
                int(r[1]),
                r[2],
                "null",
                "",
                *([uuid.uuid4().hex] if trace else []),
            )
        ]
        client.evalsha(sha["settle"], k, *keys, *flat)
    after = _cpu_us(client)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    return {"claim+settle": (after - before) / (rounds * batch)}


#: Each record form: how a script writes N new records, and how it changes each one.
RECORD_FORMS: dict[str, tuple[str, str]] = {
    "json": (
        """for i = 1, #ARGV do
  redis.call('HSET', KEYS[1], ARGV[i], cjson.encode({state = 'pending', payload = KEYS[2],
    added_at = 1733212345678, attempts = 0, token = 0}))
end""",
        """for i = 1, #ARGV do
  local rec = cjson.decode(redis.call('HGET', KEYS[1], ARGV[i]))
  rec.token = (rec.token or 0) + 1; rec.attempts = rec.attempts + 1; rec.state = 'leased'
  rec.lease_id = 'b1d4c0e5f6a7b8c9d0e1f2a3b4c5d6e7.' .. i; rec.owner = 'worker-1'
  rec.leased_at = 1733212345678; rec.expires_at = 1733212945678
  redis.call('HSET', KEYS[1], ARGV[i], cjson.encode(rec))
end""",
    ),
    "hash": (
        """for i = 1, #ARGV do
  redis.call('HSET', KEYS[1] .. ':' .. ARGV[i], 'state', 'pending', 'payload', KEYS[2],
    'added_at', 1733212345678, 'attempts', 0, 'token', 0)
end""",
        """for i = 1, #ARGV do
  local key = KEYS[1] .. ':' .. ARGV[i]
  local v = redis.call('HMGET', key, 'state', 'token', 'attempts', 'expires_at')
  redis.call('HSET', key, 'state', 'leased', 'token', (tonumber(v[2]) or 0) + 1,
    'attempts', (tonumber(v[3]) or 0) + 1, 'lease_id', 'b1d4c0e5f6a7b8c9d0e1f2a3b4c5d6e7.' .. i,
    'owner', 'worker-1', 'leased_at', 1733212345678, 'expires_at', 1733212945678)
end""",
    ),
    "packed": (
        """local set = {}
for i = 1, #ARGV do
  set[#set + 1] = ARGV[i]; set[#set + 1] = 'pending|||||||1733212345678|||||' .. KEYS[2]
end
redis.call('HSET', KEYS[1], unpack(set))""",
        """local raws = redis.call('HMGET', KEYS[1], unpack(ARGV))
local set = {}
local P = '^(%l+)|(%d*)|(%d*)|([^|]*)|([^|]*)|(%d*)|(%d*)|(%d*)|(%d*)|(%d*)|([^|]*)|(%d*)|(.*)$'
for i = 1, #ARGV do
  local s, tok, att, lid, own, lat, exp, add, upd, don, out, late, payload = raws[i]:match(P)
  local rec = {state = 'leased', token = (tonumber(tok) or 0) + 1,
    attempts = (tonumber(att) or 0) + 1,
    lease_id = 'b1d4c0e5f6a7b8c9d0e1f2a3b4c5d6e7.' .. i, owner = 'worker-1',
    leased_at = 1733212345678, expires_at = 1733212945678, added_at = add}
  set[#set + 1] = ARGV[i]
  set[#set + 1] = table.concat({rec.state, rec.token, rec.attempts, rec.lease_id, rec.owner,
    rec.leased_at, rec.expires_at, rec.added_at or '', '', '', '', '', payload}, '|')
end
redis.call('HSET', KEYS[1], unpack(set))""",
    ),
}
RECORD_PAYLOAD = '{"account":"acct_00042","cursor":"c_9","note":"' + "x" * 60 + '"}'


def _cpu_us(client: redis.Redis) -> float:
    info = client.info("cpu")
    return (float(info["used_cpu_user"]) + float(info["used_cpu_sys"])) * 1e6


def measure_record_form(
    client: redis.Redis, form: str, n: int, batch: int = 20
) -> dict[str, float]:
    """Server CPU per record change (``batch`` records per script call) and bytes per record."""
    create, change = (client.script_load(text) for text in RECORD_FORMS[form])
    prefix = f"bench-rec-{uuid.uuid4().hex[:8]}"
    key = f"{prefix}:{{r#0}}:items"
    ids = [f"item-{i:07d}" for i in range(n)]
    memory = int(client.info("memory")["used_memory"])
    for start in range(0, n, 200):
        client.evalsha(create, 2, key, RECORD_PAYLOAD, *ids[start : start + 200])
    grown = int(client.info("memory")["used_memory"]) - memory
    before = _cpu_us(client)
    for start in range(0, n, batch):
        client.evalsha(change, 2, key, RECORD_PAYLOAD, *ids[start : start + batch])
    cpu = _cpu_us(client) - before
    for found in client.scan_iter(match=f"{prefix}:*", count=1000):
        client.delete(found)
    return {"cpu_us_per_change": cpu / n, "bytes_per_record": grown / n}


def main_records(client: redis.Redis, n: int, rounds: int) -> int:
    """Interleaved rounds over the record forms; prints the medians."""
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {form: [] for form in RECORD_FORMS}
    for _ in range(rounds):
        for form in RECORD_FORMS:
            runs[form].append(measure_record_form(client, form, n))
    print(f"per item record, median of {rounds} interleaved rounds of {n} (20 per call)")
    for form, found in runs.items():
        cpu = statistics.median(r["cpu_us_per_change"] for r in found)
        size = statistics.median(r["bytes_per_record"] for r in found)
        print(f"{form:<7} {cpu:6.2f} us server CPU per change   {size:6.0f} bytes per record")
    print(f"1-minute load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the interleaved rounds and prints the medians."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="a Redis nothing else uses")
    parser.add_argument("--ref", type=Path, help="a checkout of the reference")
    parser.add_argument("--records", action="store_true", help="compare the record forms")
    parser.add_argument(
        "--batched", action="store_true", help="claim_next and settle in batches, CPU per item"
    )
    parser.add_argument(
        "--alternate",
        action="store_true",
        help="with --batched: settle each claimed batch before the next claim (as a worker)",
    )
    parser.add_argument("--batch", type=int, default=20, help="items per batch (--batched)")
    parser.add_argument(
        "--lease-base",
        type=int,
        nargs=2,
        metavar=("REF", "CUR"),
        default=(16, 16),
        help="with --alternate: hex characters of the lease id base, reference and current",
    )
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.alternate and not args.batched:
        parser.error("--alternate goes with --batched")
    if not all(4 <= n <= 32 for n in args.lease_base):
        parser.error("--lease-base takes hex lengths from 4 to 32")
    if not 1 <= args.batch <= args.items:
        parser.error("--batch must be from 1 to --items")
    client = redis.Redis.from_url(args.url)
    if args.records:
        return main_records(client, args.items, args.rounds)
    if args.ref is None:
        parser.error("--ref is required (or --records)")
    ref_src = reference_source(args.ref)
    ref_deadline = "deadline" in (args.ref / "lua" / "add_items.lua").read_text()
    load_start = os.getloadavg()[0]
    runs: dict[str, list[dict[str, float]]] = {"reference": [], "current": []}
    ref_base, cur_base = args.lease_base
    for _ in range(args.rounds):
        if args.batched and args.alternate:
            runs["reference"].append(
                measure_alternating(client, ref_src, args.items, args.batch, ref_base)
            )
            runs["current"].append(
                measure_alternating(client, source, args.items, args.batch, cur_base)
            )
        elif args.batched:
            runs["reference"].append(measure_batched(client, ref_src, args.items, args.batch))
            runs["current"].append(measure_batched(client, source, args.items, args.batch))
        else:
            runs["reference"].append(measure(client, ref_src, ref_deadline, args.items))
            runs["current"].append(measure(client, source, True, args.items))
    ops = list(runs["current"][0])
    medians = {
        kind: {op: statistics.median(r[op] for r in rounds) for op in ops}
        for kind, rounds in runs.items()
    }
    order = ", alternating" if args.alternate else ""
    unit = (
        f"server CPU usec per item (claim_next of {args.batch}, settle{order})"
        if args.batched
        else ("server usec per script call")
    )
    print(f"{unit}, median of {args.rounds} interleaved rounds of {args.items}")
    for op in ops:
        ref, cur = medians["reference"][op], medians["current"][op]
        print(f"{op:<7} reference {ref:6.1f} us   current {cur:6.1f} us   {cur / ref:.2f}x")
    print(f"1-minute load average at start / end: {load_start:.2f} / {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
