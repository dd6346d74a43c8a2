"""Repeated Redis stalls, failovers and skewed clocks under a live fleet: no live worker may
be taken over.

Every part runs real ``redis-lease worker`` processes on private servers
(:mod:`tests.faults.cluster`) and ends with the history checker; leases are at the default
60 s, so only a takeover could re-claim an item:

- **stalls**: one run of the effects job on ``--workers`` workers (one shard each, two
  handlers each), its handler passes held at a hold so that every shard job holds leases
  and beats through each stall. ``--stalls`` times, redis-server is SIGSTOPped for the
  next of ``--lengths`` seconds (every third stall a script keeps it busy instead, so
  that calls are refused with BUSY), then resumed; the fleet rides out a stall's grace
  (``DEAD_AFTER`` + 2 s) and a few held passes go on. Counted over the run: takeovers
  logged, items re-claimed from a lease that ended (the run's ``takeovers`` counter,
  ``redis_lease_takeovers_total``), leases cut, shard jobs counted failed, and "took over"
  lines in the workers' logs;
- **failovers**: ``--failovers`` times, a Sentinel group's primary is SIGKILLed while both
  workers' shard jobs hold leases and beat, and its replica is promoted 6 s later
  (``down-after-milliseconds``); the same counts;
- **skew**: ``--skew-runs`` runs of 150 items on two workers whose clocks run 2 h ahead
  and 2 h behind (libfaketime), 2 s leases: takeovers and calls refused as stale.

It prints one JSON object with the figures and the settings, and exits 1 when anything
was taken over, refused as stale, or failed a check. ``make stalls`` runs the whole of it
(20 stalls of 6 to 30 s, 3 failovers, 6 skewed runs: about 10 minutes)::

    python -m tests.faults.stalls --stalls 20 --failovers 3 --skew-runs 6
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from redis_lease.demo.provider import ProviderState
from redis_lease.errors import RedisLeaseError
from redis_lease.fleet.jobs.job import JobOptions
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport.shard_jobs import live_jobs
from redis_lease.fleet.transport.takeover import takeovers
from redis_lease.limits import DEAD_AFTER
from tests.faults.checker import Summary, Violation
from tests.faults.cluster import Cluster, faketime_library

#: Seconds of each stall, in turn.
LENGTHS = (6.0, 10.0, 15.0, 20.0, 30.0)
DEFAULT_TTL = JobOptions().lease_ttl_seconds


def log(line: str) -> None:
    """Progress on stderr."""
    print(line, file=sys.stderr, flush=True)


def keyless(**settings: Any) -> dict[str, Any]:
    """A provider that applies a repeated key again: only the fence stops a second payout."""
    return {"provider": ProviderState(honour_keys=False), "honours_keys": False, **settings}


def counts(c: Cluster, run_id: str) -> dict[str, int]:
    """What a stall must not have caused, so far."""
    counters = c.store.status(run_id).counters
    took = sum(worker.log.read_text(errors="replace").count("took over") for worker in c.workers)
    return {
        "takeovers_logged": len([t for t in takeovers(c.store) if t.get("run_id") == run_id]),
        "items_reclaimed": int(counters.get("takeovers", 0)),
        "leases_cut": int(counters.get("leases_cut", 0)),
        "stale_refused": int(counters.get("stale_refused", 0)),
        "shard_jobs_failed": int(Runs(c.store).info(run_id).get("failed_jobs") or 0),
        "took_over_lines": took,
    }


def ride_out(c: Cluster, run_id: str, seconds: float) -> None:
    """Ticks the run for ``seconds``."""
    until = time.monotonic() + seconds
    c.drive(run_id, until=lambda: time.monotonic() > until)


def check(c: Cluster, run_id: str, **options: Any) -> tuple[Summary | None, str]:
    """The history checker's summary, or its violation."""
    try:
        return c.verify(run_id, **options), ""
    except Violation as error:
        return None, str(error).splitlines()[0]


def stalls(directory: Path, count: int, lengths: tuple[float, ...], workers: int) -> dict[str, Any]:
    """``count`` stalls of redis-server under one run; the figures."""
    concurrency = 2
    per_cycle = workers * concurrency
    items = (count + 2) * per_cycle + 8
    settings = keyless(items=items, shards=workers, ttl=DEFAULT_TTL, hold_after=8)
    prefix = f"stalls-{uuid.uuid4().hex[:8]}"
    done: list[dict[str, Any]] = []
    with Cluster(directory, prefix, workers=workers, concurrency=concurrency, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        for n in range(count):
            seconds = lengths[n % len(lengths)]
            kind = "script" if n % 3 == 2 else "sigstop"
            c.drive(
                run_id,
                timeout=120,
                until=lambda: c.held() >= workers and c.beating_jobs() == workers,
            )
            before = counts(c, run_id)
            started = time.monotonic()
            if kind == "sigstop":
                c.stop_redis()
                time.sleep(seconds)
                c.cont_redis()
            else:
                busy = c.long_script(seconds)
                while busy.is_alive():  # look as the tick does, all along
                    with contextlib.suppress(RedisLeaseError, redis.RedisError):
                        live_jobs(c.store, run_id)
                    time.sleep(0.02)
            ride_out(c, run_id, DEAD_AFTER + 2)
            after = counts(c, run_id)
            changed = {k: after[k] - before[k] for k in after if after[k] != before[k]}
            done.append(
                {
                    "n": n + 1,
                    "kind": kind,
                    "seconds": round(time.monotonic() - started - DEAD_AFTER - 2, 1),
                    "changed": changed,
                }
            )
            log(f"stall {n + 1}/{count}: {kind} {seconds:.0f} s -> {changed or 'nothing taken'}")
            c.hold_more(per_cycle)
        c.lift_hold()
        state = c.drive(run_id, timeout=300)
        summary, violation = check(c, run_id)
        final = counts(c, run_id)
    return {
        "stalls": done,
        "state": state,
        "totals": final,
        "checker": _summary(summary, violation),
        "settings": {"workers": workers, "concurrency": concurrency, "items": items},
    }


def failovers(directory: Path, count: int) -> list[dict[str, Any]]:
    """``count`` failovers after the primary died, each on a group of its own."""
    from tests.redis_cluster import _admin
    from tests.test_sentinel import SentinelCluster, judge_on

    found = []
    for n in range(count):
        prefix = f"failover-{uuid.uuid4().hex[:8]}"
        settings = keyless(items=40, shards=2, ttl=DEFAULT_TTL, hold_after=8)
        with SentinelCluster(
            directory / f"failover-{n}", prefix, down_after_ms=6000, workers=2, **settings
        ) as c:
            c.wait_ready()
            run_id = c.start_run()
            c.drive(run_id, timeout=120, until=lambda: c.held() >= 2 and c.beating_jobs() == 2)
            old = c.group.primary_port()
            with _admin(old) as primary:
                killed = _ms(primary)
            c.group.kill_primary()
            new = c.group.wait_for_new_primary(old, timeout=60)
            with _admin(new) as promoted:
                named = _ms(promoted)
            ride_out(c, run_id, DEAD_AFTER + 3)
            c.lift_hold()
            state = c.drive(run_id, timeout=120)
            judge_on(c, new)
            summary, violation = check(c, run_id, loss=(killed - 1000, named + 1000))
            entry = {"n": n + 1, "switch_ms": named - killed, "state": state}
            entry.update(counts(c, run_id), checker=_summary(summary, violation))
            found.append(entry)
            log(f"failover {n + 1}/{count}: {entry}")
    return found


def skewed(directory: Path, runs: int) -> list[dict[str, Any]]:
    """``runs`` runs on clocks 2 h ahead and 2 h behind, 2 s leases, 150 items."""
    found = []
    for n in range(runs):
        prefix = f"skew-{uuid.uuid4().hex[:8]}"
        settings: dict[str, Any] = {"items": 150, "shards": 2, "ttl": 2.0}
        settings["provider"] = ProviderState(latency=0.03)
        with Cluster(
            directory / f"skew-{n}",
            prefix,
            workers=2,
            concurrency=16 if n % 2 else 1,
            clocks=["+2h", "-2h"],
            **settings,
        ) as c:
            c.wait_ready()
            run_id = c.start_run()
            state = c.drive(run_id, timeout=120)
            summary, violation = check(c, run_id)
            entry = {"n": n + 1, "concurrency": c.concurrency, "state": state}
            entry.update(counts(c, run_id), checker=_summary(summary, violation))
            found.append(entry)
            log(f"skew {n + 1}/{runs}: {entry}")
    return found


def _ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _summary(summary: Summary | None, violation: str) -> dict[str, Any]:
    if summary is None:
        return {"violation": violation}
    return {
        "takeovers": summary.takeovers,
        "stale_refused": summary.stale_refused,
        "effects_applied": summary.effects_applied,
        "done": summary.done,
    }


def bad(result: dict[str, Any]) -> list[str]:
    """What went wrong in ``result``: anything taken over, refused or violated."""
    wrong = []
    rows = (
        [("stalls", result["stalls"]["totals"], result["stalls"]["checker"])]
        if result.get("stalls")
        else []
    )
    rows += [(f"failover {f['n']}", f, f["checker"]) for f in result.get("failovers", [])]
    rows += [(f"skew {s['n']}", s, s["checker"]) for s in result.get("skew", [])]
    for name, figures, checker in rows:
        taken = {
            k: v
            for k, v in figures.items()
            if k
            in (
                "takeovers_logged",
                "items_reclaimed",
                "leases_cut",
                "stale_refused",
                "shard_jobs_failed",
                "took_over_lines",
            )
            and v
        }
        if taken:
            wrong.append(f"{name}: {taken}")
        if "violation" in checker or checker.get("takeovers") or checker.get("stale_refused"):
            wrong.append(f"{name}: checker {checker}")
    return wrong


def main(argv: list[str] | None = None) -> int:
    """The command line: ``python -m tests.faults.stalls [--stalls N] ...``."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stalls", type=int, default=20)
    parser.add_argument(
        "--lengths",
        default=",".join(f"{s:g}" for s in LENGTHS),
        help="seconds of each stall, in turn (comma-separated)",
    )
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--failovers", type=int, default=3)
    parser.add_argument("--skew-runs", type=int, default=6)
    parser.add_argument("--dir", type=Path, default=None, help="keep the files here")
    args = parser.parse_args(argv)
    lengths = tuple(float(s) for s in args.lengths.split(","))
    if args.skew_runs and faketime_library() is None:
        log("libfaketime is missing (apt-get install faketime): no skewed runs")
        args.skew_runs = 0
    started = time.monotonic()
    result: dict[str, Any] = {"load_at_start": [round(x, 2) for x in os.getloadavg()]}
    with contextlib.ExitStack() as stack:
        directory = args.dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        if args.stalls:
            result["stalls"] = stalls(directory / "stalls", args.stalls, lengths, args.workers)
        if args.failovers:
            result["failovers"] = failovers(directory, args.failovers)
        if args.skew_runs:
            result["skew"] = skewed(directory, args.skew_runs)
    result["load_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["seconds"] = round(time.monotonic() - started)
    result["wrong"] = bad(result)
    print(json.dumps(result, indent=1))
    return 1 if result["wrong"] else 0


if __name__ == "__main__":
    sys.exit(main())
