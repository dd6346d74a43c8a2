"""Profiles the shard loop in one process: items/s, and where its time goes.

Runs :func:`redis_lease.fleet.worker.shard_loop.work_shard` over a one-shard run of ``--items``
items on a private ``redis-server`` (or ``--url``), with a kept lease renewed
by a started :class:`~redis_lease.fleet.worker.lease_keeper.LeaseKeeper`, and a handler that does
nothing (``--delay 0``) or sleeps (``--delay 0.001``; ``--async`` for an
``async def`` handler). With a sleeping handler it also prints the share of the
ideal ``concurrency / delay`` items/s (every slot busy all the time). With
``--profile`` it prints pyinstrument's tree.

``--burst-exit`` instead times a ``redis-lease worker --burst --simple``
process from its last item done to its exit; ``--keeper`` times the lease
keeper's tick (renew 16 leases, beat the heartbeat, read the stop request).

Usage::

    .venv/bin/python benchmarks/profile_worker.py --items 4000 --delay 0 [--profile]
    .venv/bin/python benchmarks/profile_worker.py --items 2000 --delay 0.001 --concurrency 16
    .venv/bin/python benchmarks/profile_worker.py --items 2000 --delay 0.02 --concurrency 16 --async
    .venv/bin/python benchmarks/profile_worker.py --burst-exit
    .venv/bin/python benchmarks/profile_worker.py --keeper
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_fleet import redis_for  # noqa: E402
from redis_lease.fleet.jobs.job import Job  # noqa: E402
from redis_lease.fleet.jobs.live_lease import ActiveLease  # noqa: E402
from redis_lease.fleet.transport.shard_jobs import enqueue_shard, purge_queue  # noqa: E402
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper  # noqa: E402
from redis_lease.fleet.worker.shard_job import work_shard  # noqa: E402
from redis_lease.protocol.leases import Item  # noqa: E402
from redis_lease.protocol.store.lease_store import LeaseStore  # noqa: E402


def make_job(delay: float, concurrency: int, use_async: bool) -> Job:
    """A one-shard job whose handler sleeps ``delay`` seconds (0: does nothing)."""
    options: dict[str, Any] = {"shards": 1, "lease_ttl_seconds": 60, "batch_size": 20}
    if concurrency > 1:
        options["concurrency"] = concurrency
    job = Job("profile", **options)

    if use_async:

        @job.handler
        async def handle_async(item: Item, lease: ActiveLease) -> None:
            if delay:
                await asyncio.sleep(delay)

    else:

        @job.handler
        def handle(item: Item, lease: ActiveLease) -> None:
            if delay:
                time.sleep(delay)

    return job


def shard_pass(store: LeaseStore, job: Job, items: int) -> tuple[float, Any]:
    """Adds ``items`` items to a fresh run and works its shard; returns (seconds, report)."""
    run_id = f"profile:{uuid.uuid4().hex[:8]}"
    store.add(run_id, [Item(f"i{n:07d}", {"n": n}) for n in range(items)], shards=1)
    keeper = LeaseKeeper(store, job.options.lease_ttl_seconds)
    keeper.start()
    started = time.perf_counter()
    try:
        kwargs: dict[str, Any] = {}
        if "concurrency" in inspect.signature(work_shard).parameters:
            kwargs["concurrency"] = job.options.concurrency
        report = work_shard(
            store,
            job,
            run_id,
            0,
            worker="profile",
            budget=600,
            stop=threading.Event(),
            keeper=keeper,
            **kwargs,
        )
    finally:
        keeper.close()
    return time.perf_counter() - started, report


def burst_exit(url: str, prefix: str) -> float:
    """Seconds from a burst worker's last item done to its exit."""

    queue_name = f"profile-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "FLEET_QUEUE": queue_name, "FLEET_ITEMS": "20", "FLEET_SHARDS": "1"}
    env["PYTHONPATH"] = str(ROOT)
    store = LeaseStore.from_url(url, prefix=prefix)
    run_id = f"fleet:{uuid.uuid4().hex[:8]}"
    store.add(run_id, [Item(f"item-{n:04d}", {"n": n}) for n in range(20)], shards=1)
    enqueue_shard(store, "tests.fleet_jobs:fleet", queue_name, run_id, 0, 30)
    args = [sys.executable, "-m", "redis_lease", "--url", url, "--prefix", prefix, "worker"]
    args += ["--burst", "--simple", "--queue", queue_name]
    process = subprocess.Popen(args, env=env, cwd=ROOT)
    last_done = None
    while process.poll() is None:
        if last_done is None and store.status(run_id).counts.get("done", 0) == 20:
            last_done = time.perf_counter()
        time.sleep(0.002)
    ended = time.perf_counter()
    purge_queue(store.client, queue_name)
    if last_done is None:
        raise RuntimeError(f"the worker exited ({process.returncode}) before every item was done")
    return ended - last_done


def keeper_ticks(store: LeaseStore, ticks: int = 2000) -> float:
    """Microseconds per keeper tick with 16 held leases, a heartbeat and a stop check."""
    run_id = f"profile:{uuid.uuid4().hex[:8]}"
    store.add(run_id, [Item(f"k{n:03d}") for n in range(16)], shards=4)
    leases = store.claim_next(run_id, "keeper", limit=16, ttl=60)
    flag = (f"{store.prefix}:stop", "shutdown_requested_date")
    params = inspect.signature(LeaseKeeper).parameters
    if "stop_flag" in params:
        keeper = LeaseKeeper(store, 60, beat_key=f"{store.prefix}:beat", stop_flag=flag)
        tick = keeper.tick
    else:  # the keeper before its tick was one round trip
        check = partial(store.client.hget, *flag)
        old: Any = LeaseKeeper(store, 60, f"{store.prefix}:beat", check)  # type: ignore[arg-type]
        keeper = old

        def tick() -> None:
            old.renew_all()
            old.beat()
            old.stop_check()

    for lease in leases:
        keeper.hold(ActiveLease(store, lease, 60))
    started = time.perf_counter()
    for _ in range(ticks):
        tick()
    return (time.perf_counter() - started) / ticks * 1e6


def main(argv: list[str] | None = None) -> int:
    """Runs the figures asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--async", dest="use_async", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--burst-exit", action="store_true")
    parser.add_argument("--keeper", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder, redis_for(args.url, Path(folder)) as (url, _):
        prefix = f"prof{uuid.uuid4().hex[:8]}"
        if args.burst_exit:
            times = sorted(burst_exit(url, prefix) for _ in range(args.repeat))
            print(f"burst exit after the last item: median {times[len(times) // 2]:.3f}s {times}")
            return 0
        store = LeaseStore.from_url(url, prefix=prefix)
        if args.keeper:
            costs = sorted(keeper_ticks(store) for _ in range(args.repeat))
            median = costs[len(costs) // 2]
            print(
                f"keeper tick: median {median:.0f} us of {[round(c) for c in costs]}; "
                f"load {os.getloadavg()[0]:.2f}"
            )
            return 0
        job = make_job(args.delay, args.concurrency, args.use_async)
        shard_pass(store, job, min(args.items, 200))  # warm-up: scripts loaded, imports done
        rates = []
        for _ in range(args.repeat):
            if args.profile:
                from pyinstrument import Profiler

                profiler = Profiler(interval=0.0005)
                profiler.start()
            seconds, report = shard_pass(store, job, args.items)
            if args.profile:
                profiler.stop()
                print(profiler.output_text(unicode=False, color=False, show_all=False))
            rates.append(args.items / seconds)
            assert report.committed == args.items, report
        rates.sort()
        median = rates[len(rates) // 2]
        # Every slot busy all the time: concurrency / delay items/s.
        ideal = f"; {median * args.delay / args.concurrency:.1%} of the ideal" if args.delay else ""
        print(
            f"items/s median {median:.0f} of {[round(r) for r in rates]} "
            f"(items {args.items}, delay {args.delay}, concurrency {args.concurrency}, "
            f"async {args.use_async}){ideal}; load {os.getloadavg()[0]:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
