"""A Redis that stalls takes over no live worker; skewed clocks change nothing; a shard job
that finds its registration gone stops claiming.

Real ``redis-lease worker`` processes (tests.faults.cluster: a private Redis, a proxy, a
provider that ignores idempotency keys, the history checker):

- ``redis-server`` SIGSTOPped for 6 s and for 12 s, or kept busy by a script for 8 s,
  while both workers' shard jobs hold leases (the default 60 s) and beat: the server's
  clock ran on past every beat's life, but no shard job is taken over, no lease is cut or
  re-claimed, no shard job failure is counted, and the run succeeds with every payout
  applied once (the longer repeat, 20 stalls of up to 30 s, is ``make stalls``:
  tests/faults/stalls.py);
- two workers whose clocks run 2 h ahead and 2 h behind (libfaketime), 2 s leases: no
  takeover and no call refused as stale;
- a shard job whose registration is taken away (as a takeover does) stops claiming, gives
  back what it claimed and had not started, does not enqueue itself again, and ends.

The Sentinel failover test is in tests/test_sentinel.py; the SIGKILLed worker taken over
within 10 s in tests/test_takeover_fleet.py.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from rq.job import Job as RQJob
from rq.serializers import JSONSerializer

from redis_lease import Item, Job, LeaseStore
from redis_lease.demo.provider import ProviderState
from redis_lease.errors import RedisLeaseError
from redis_lease.fleet.jobs.job import JobOptions
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport.shard_jobs import live_jobs
from redis_lease.fleet.transport.takeover import registered, takeovers
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
from redis_lease.fleet.worker.shard_loop import work_shard
from redis_lease.limits import DEAD_AFTER
from tests.faults.cluster import LONG_SCRIPT, Cluster, require_faketime
from tests.fleet_helpers import wait_for
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow

#: The default lease length: far longer than any stall here, so only a takeover could
#: re-claim an item.
DEFAULT_TTL = JobOptions().lease_ttl_seconds


def keyless(**settings: Any) -> dict[str, Any]:
    """A provider that applies a repeated key again: only the fence stops a second payout."""
    return {"provider": ProviderState(honour_keys=False), "honours_keys": False, **settings}


def settings() -> dict[str, Any]:
    """Two shards, leases at the default length, the passes past the 8th waiting at the hold
    (their shard jobs alive, holding leases, beating) until the test lifts it; a provider of
    the test's own."""
    return keyless(items=40, shards=2, ttl=DEFAULT_TTL, hold_after=8)


@pytest.mark.parametrize("seconds", [6.0, 12.0])
def test_a_redis_stall_takes_over_no_live_worker(
    tmp_path: Path, prefix: str, seconds: float
) -> None:
    """redis-server SIGSTOPped while both shard jobs hold leases and beat: its clock runs on
    past every beat's life, and every call waits until it is SIGCONTed."""
    with Cluster(tmp_path / "c", prefix, workers=2, **settings()) as c:
        c.wait_ready()
        run_id = c.start_run()
        # both workers' shard jobs hold leases and beat; their handlers wait at the hold
        c.drive(run_id, until=lambda: c.held() >= 2 and c.beating_jobs() == 2)
        c.stop_redis()
        time.sleep(seconds)  # the fault itself: the server's clock runs on past every beat
        c.cont_redis()
        ride_out_and_finish(c, run_id)


def test_a_long_script_takes_over_no_live_worker(tmp_path: Path, prefix: str) -> None:
    """A script keeps redis-server busy for 8 s while both shard jobs hold leases and beat:
    every call waits, then is refused (BUSY) until it ends. The test looks for dead shard
    jobs as the tick does (``live_jobs``) every 20 ms, so it reaches Redis before any
    keeper beats again."""
    with Cluster(tmp_path / "c", prefix, workers=2, **settings()) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: c.held() >= 2 and c.beating_jobs() == 2)
        busy = c.long_script(8.0)
        ended = 0.0
        while not ended or time.monotonic() < ended + 1.0:
            if not ended and not busy.is_alive():
                ended = time.monotonic()
            with contextlib.suppress(RedisLeaseError, redis.RedisError):
                live_jobs(c.store, run_id)
            time.sleep(0.02)
        ride_out_and_finish(c, run_id)


def ride_out_and_finish(c: Cluster, run_id: str) -> None:
    """After the stall: no takeover while the run goes on past a stall's grace (every job
    has DEAD_AFTER seconds to beat again, every watch and the tick look each second), and
    none until the run succeeds with every payout applied once."""
    until = time.monotonic() + DEAD_AFTER + 3
    c.drive(run_id, until=lambda: time.monotonic() > until)
    c.assert_no_takeover(run_id)
    assert c.beating_jobs() == 2
    c.lift_hold()
    assert c.drive(run_id, timeout=90) == "succeeded"
    summary = c.verify(run_id)  # fenced, every item done, each payout applied once
    assert summary.effects_applied == c.config.items
    c.assert_no_takeover(run_id, summary)


@pytest.mark.parametrize("concurrency", [1, 16], ids=["c1", "c16"])
def test_skewed_worker_clocks_with_short_leases_see_no_takeover_and_no_stale_call(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    """Clocks 2 h ahead and 2 h behind, leases of 4 s renewed every 4/3 s, 150 items.

    Breaks if a worker's clock took part in a decision (a takeover, an expiry), or if a
    renewal reached Redis behind its item's commit (refused: counted stale).
    """
    require_faketime()
    # 4 s leases renewed every 4/3 s: short beside 2 h of skew, long enough for a keeper on
    # a loaded machine (2 s ones ran out there, a keeper late by more than 1.3 s)
    settings: dict[str, Any] = {"items": 150, "shards": 2, "ttl": 4.0}
    settings["provider"] = ProviderState(latency=0.03)
    with Cluster(
        tmp_path / "c",
        prefix,
        concurrency=concurrency,
        workers=2,
        clocks=["+2h", "-2h"],
        **settings,
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        assert c.drive(run_id, timeout=90) == "succeeded"
        summary = c.verify(run_id)
        refused = [op for op in c.ops() if str(op.get("error", "")).startswith("LEASE_LOST")]
        assert (summary.stale_refused, refused) == (0, []), summary
        assert c.store.status(run_id).counters.get("stale_refused") is None
        c.assert_no_takeover(run_id, summary)


def test_a_shard_job_whose_registration_is_gone_stops_claiming_and_ends(
    tmp_path: Path, prefix: str
) -> None:
    """Its registry entry is taken away as a watcher's takeover does (its leases are left
    as they are): at its next beat the shard job learns it, stops claiming, gives back
    the items it claimed and had not started, lets its running handler finish, and ends
    without enqueueing itself again; the tick then enqueues the shard's next job."""
    settings = keyless(items=30, shards=1, ttl=DEFAULT_TTL, hold_after=4, batch_size=10)
    with Cluster(tmp_path / "c", prefix, workers=1, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=lambda: c.held() >= 1 and c.beating_jobs() == 1)
        (entry,) = registered(c.store)
        assert entry.job is not None
        rq_id = entry.job.rq_id
        entries, beats, _taking, _clock = c.store.keys.shard_job_registry
        c.store.client.zrem(beats, rq_id)
        c.store.client.hdel(entries, rq_id)
        log = c.workers[0].log
        wait_for(
            lambda: f"shard job {rq_id} is no longer registered" in log.read_text(errors="replace"),
            10,
            "the shard job to learn that it is no longer registered",
        )
        c.lift_hold()
        wait_for(
            lambda: "it stopped claiming and ends" in log.read_text(errors="replace"),
            30,
            "the shard job to end",
        )
        rq_job = RQJob.fetch(rq_id, connection=c.store.rq, serializer=JSONSerializer)
        wait_for(lambda: rq_job.get_status() == "finished", 10, "RQ to mark the job finished")
        report = rq_job.return_value()
        assert report is not None and report["taken_over"] is True, report
        # one claim of a batch: the items started before the hold, and the held one, were
        # handled and committed (their leases stood), the rest given back; no claim after
        assert report["handled"] == report["committed"] == c.config.hold_after + 1, report
        assert report["released"] == c.config.batch_size - report["handled"], report
        assert c.drive(run_id, timeout=60) == "succeeded"  # the tick's next shard job
        summary = c.verify(run_id)
        assert summary.effects_applied == c.config.items
        assert "Traceback" not in log.read_text(errors="replace")
        # it neither enqueued itself again nor was counted failed; nothing was taken over
        assert Runs(c.store).info(run_id).get("failed_jobs") in (None, "0")
        assert takeovers(c.store) == []


def test_a_commit_that_meets_a_busy_redis_is_sent_again_not_left_to_its_lease(
    private_redis: Callable[..., RedisServer], prefix: str
) -> None:
    """The first handler starts a script that keeps Redis busy for 6 s (its
    ``busy-reply-threshold`` lowered to 1 s) and returns once calls are refused with BUSY:
    its commit, and the next claim, meet BUSY. The commit waits and is sent again once the
    script ends, by the same holder with the same token; nothing is left to its lease
    expiry, and no shard job fails."""
    server = private_redis(**{"busy-reply-threshold": "1000"})
    store = LeaseStore.from_url(server.url, prefix=prefix)
    direct = redis.Redis.from_url(server.url, socket_timeout=30)
    busy: list[threading.Thread] = []
    job = Job("busy-commit", shards=1, lease_ttl_seconds=DEFAULT_TTL, commit_interval_seconds=0)

    @job.handler
    def handle(item: Item, lease: Any) -> dict[str, Any]:
        if not busy:
            busy.append(threading.Thread(target=direct.eval, args=(LONG_SCRIPT, 0, 6000)))
            busy[0].start()
            wait_for(lambda: refused_busy(server.url), 10, "Redis to answer BUSY")
        return {"token": lease.token}

    try:
        store.add("busy-run", [Item(f"i{n}") for n in range(4)], shards=1)
        keeper = LeaseKeeper(store, DEFAULT_TTL)
        keeper.start()
        try:
            report = work_shard(
                store,
                job,
                "busy-run",
                0,
                worker="w",
                budget=60,
                stop=threading.Event(),
                keeper=keeper,
            )
        finally:
            keeper.close()
        assert (report.committed, report.abandoned, report.stale) == (4, 0, 0), report
        records = store.items("busy-run", 0)
        assert {(r.state, r.token) for r in records} == {("done", 1)}
        assert store.status("busy-run").counters.get("takeovers") is None
    finally:
        for thread in busy:
            thread.join(timeout=30)
        store.client.close()
        direct.close()


def refused_busy(url: str) -> bool:
    """True when the server at ``url`` answers BUSY."""
    with redis.Redis.from_url(url, socket_timeout=5) as client:
        try:
            client.ping()
        except redis.ResponseError as error:
            return str(error).startswith("BUSY")
    return False
