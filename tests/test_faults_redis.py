"""Faults of the Redis server under real RQ worker processes (tests.faults.cluster).

Each test runs the effects job on ``redis-lease worker`` processes against a
private ``redis-server`` and injects one server fault while the run works:
SIGSTOP past the leases, SIGKILL and a restart from the AOF (``always``, and
``everysec`` with a process crash and with a power loss's disk), a restart
with no data, ``SCRIPT FLUSH`` once and in a storm, an evicting memory policy.
The history checker (tests.faults.checker) then judges the recorded history,
the provider's log and the final state; where the server may have forgotten
writes it is told the window of server time in which it may have.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from redis_lease import Item, LeaseStore
from redis_lease.demo.provider import ProviderState
from redis_lease.errors import RedisLeaseError
from redis_lease.fleet.runs.lifecycle import FINAL_STATES, Runs
from redis_lease.fleet.tick.scheduler_tick import NO_RECORD
from redis_lease.protocol.keys import shard_of
from tests.faults.checker import Violation, check
from tests.faults.cluster import Cluster
from tests.faults.recorder import Op

pytestmark = pytest.mark.slow


@pytest.fixture(params=[1, 16], ids=["c1", "c16"])
def concurrency(request: pytest.FixtureRequest) -> int:
    """Handlers each worker runs at once: the faults meet one at a time, and 16."""
    return int(request.param)


def done(c: Cluster, run_id: str) -> Callable[[], bool]:
    """A check: at least a quarter of the run's items are done and the rest of the run
    waits at the hold (settings' ``hold_after``), so that the fault comes mid-run however
    slow the machine; the test lifts the hold once the fault is in place."""
    return c.work_held(run_id, c.config.items // 4)


def for_a_while(seconds: float) -> Callable[[], bool]:
    """A check that holds once ``seconds`` have passed (how long a fault lasts)."""
    until = time.monotonic() + seconds
    return lambda: time.monotonic() >= until


def granted(ops: list[Op], before_ms: int | None = None) -> dict[tuple[str, int], int]:
    """(item, token) of every grant the workers saw (before ``before_ms``), with its time."""
    found = {}
    for op in ops:
        for grant in op.get("grants") or []:
            if before_ms is None or grant["server_ms"] < before_ms:
                found[(grant["item"], int(grant["token"]))] = int(grant["server_ms"])
    return found


def records_now(c: Cluster, run_id: str) -> dict[str, tuple[str, int]]:
    """Each item's state and token as the server has them now."""
    return {
        record.item_id: (record.state, record.token)
        for shard in range(c.config.shards)
        for record in c.store.items(run_id, shard)
    }


def vanished(ops: list[Op], now: dict[str, tuple[str, int]]) -> tuple[list[Any], list[str]]:
    """The grants and the accepted commits the workers saw that the server no longer has."""
    grants = [(i, t) for (i, t) in granted(ops) if now.get(i, ("", 0))[1] < t]
    commits = [i for i, t in committed(ops).items() if now.get(i) != ("done", t)]
    return grants, commits


def mid_run(now: dict[str, tuple[str, int]]) -> bool:
    """True when some item of the run is still to do (the fault came mid-run)."""
    return any(state != "done" for state, _ in now.values())


def committed(ops: list[Op]) -> dict[str, int]:
    """The token of every commit the workers saw accepted, by item."""
    return {
        op.get("item"): int(op.get("token"))
        for op in ops
        if op.get("f") == "commit" and op.type == "ok"
    }


@pytest.fixture
def settings(concurrency: int) -> dict[str, Any]:
    """A run of about 2 s: 48 items, 2 shards, 1.5 s leases, a provider taking 80 ms.

    With several handlers per worker: 8 times the items and calls 4 times slower
    (a run of about 4 s). The passes past a quarter and 4 wait at the hold until the
    test lifts it (see :func:`done`).
    """
    items, latency = (48 * 8, 0.08 * 4) if concurrency > 1 else (48, 0.08)
    return {
        "items": items,
        "hold_after": items // 4 + 4,
        "shards": 2,
        "ttl": 1.5,
        "provider": ProviderState(honour_keys=False, latency=latency),
        "honours_keys": False,
    }


# -- the server paused -------------------------------------------------------------------


def test_redis_paused_past_the_leases(
    tmp_path: Path, prefix: str, settings: Any, concurrency: int
) -> None:
    """SIGSTOP redis-server for 2.5 s (leases last 1.5 s), then SIGCONT.

    Its clock runs on while it is stopped: every lease held then has expired when
    it answers again, and the writes queued meanwhile must be refused. Breaks if
    one is accepted (an expired write) or the run does not recover.
    """
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=done(c, run_id))
        c.stop_redis()
        c.lift_hold()  # the held items' leases are out when the server stops
        time.sleep(2.5)  # the fault itself: the server stays stopped past every lease
        c.cont_redis()
        assert c.drive(run_id, timeout=60) == "succeeded"
        summary = c.verify(run_id)
        expired = c.store.status(run_id).counters.get("expired", 0)
        assert expired + summary.takeovers >= 1, summary  # the pause did outlast leases


# -- a crash and a restart from the AOF ---------------------------------------------


def test_redis_killed_with_aof_always_loses_nothing(
    tmp_path: Path, prefix: str, settings: Any, concurrency: int
) -> None:
    """SIGKILL redis-server mid-run (``appendfsync always``) and restart it from its AOF.

    Every reply a worker got was on disk: no grant or commit a worker saw may be
    missing after the restart. Breaks if one is (then a token repeats, which the
    checker also reports without a loss window).
    """
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=done(c, run_id))
        c.refuse(30)  # the workers stay away until the restarted state is read
        c.kill_redis()
        c.restart_redis()
        ops, now = c.ops(), records_now(c, run_id)
        c.refuse(0)
        c.lift_hold()
        assert vanished(ops, now) == ([], [])
        assert committed(ops) and mid_run(now)
        assert c.drive(run_id, timeout=60) == "succeeded"
        c.verify(run_id)


@pytest.mark.parametrize("crash", ["process-kill", "power-loss"])
def test_redis_with_aof_everysec_loses_at_most_the_last_second(
    tmp_path: Path, prefix: str, settings: Any, crash: str, concurrency: int
) -> None:
    """``appendfsync everysec``: a process kill, or a power loss that keeps the disk as
    it was a second before (the server's files are copied then and restored).

    What vanished is measured (grants and commits the workers saw that the
    restarted server lacks) and printed. The checker is told that writes after
    the disk copy (or, for the process kill, in the 2 s before it, the most
    ``everysec`` may put off) may be lost: tokens may repeat only for leases
    granted then, and the run must not end succeeded with an item lost. With a
    power loss something does vanish, and the checker without the window sees it.
    """
    config = {"appendfsync": "everysec"}
    latency = settings["provider"].latency  # keys honoured: a lost ledger entry
    settings["provider"] = ProviderState(latency=latency)
    settings["honours_keys"] = True  # leaves only them to stop a second payout
    with Cluster(
        tmp_path / "c", prefix, concurrency=concurrency, workers=2, redis_config=config, **settings
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=done(c, run_id))
        image, since = c.disk_image() if crash == "power-loss" else (None, 0)
        c.hold_more(c.config.items // 4)  # a second of work, the run still unfinished
        last_second = for_a_while(1.0)

        def worked() -> bool:  # claims made after the disk image, to be lost with it
            return last_second() and (image is None or max(granted(c.ops()).values()) > since)

        c.drive(run_id, until=worked)  # the last second before the crash
        c.refuse(30)
        killed = c.kill_redis()
        restarted = c.restart_redis(disk=image)
        ops, now = c.ops(), records_now(c, run_id)
        c.refuse(0)
        c.lift_hold()
        since = since or killed - 2000
        grants, commits = vanished(ops, now)
        assert mid_run(now)
        times = granted(ops)
        assert all(times[grant] >= since for grant in grants)  # only the last second's
        assert c.drive(run_id, timeout=60) == "succeeded"
        summary = c.verify(run_id, loss=(since, restarted))
        repeats = sum(n > 1 for n in c.provider.state.requests.values())
        print(
            f"{crash}: {len(grants)} of {len(times)} grants and {len(commits)} of "
            f"{len(committed(ops))} accepted commits vanished; {summary.regranted_after_loss} "
            f"tokens granted again; {repeats} payouts sent twice, applied once by key"
        )
        # each item that lost a grant had a token granted again (two lost grants of one
        # item, a takeover inside the lost second, come back as one)
        assert summary.regranted_after_loss >= (1 if grants else 0)
        if crash == "power-loss":
            assert grants, "a second of claims was lost with the disk"
            with pytest.raises(Violation) as seen:  # without the window, the loss shows
                c.verify(run_id)
            assert seen.value.kinds & {"duplicate-grant", "token-order", "double-commit"}


# -- a restart with no data ----------------------------------------------------------


def test_redis_restarted_empty_recreates_the_run(
    tmp_path: Path, prefix: str, settings: Any, concurrency: int
) -> None:
    """The server restarts with no data mid-run; the tick re-creates the run and says so.

    The ticks after the restart come from a store that remembers nothing of the data set
    (as a new cron process does): it cannot tell the wipe from a new deployment and says
    so (tests/test_loss_faults.py has the tick side that remembers, and tells the wipe).
    The job fires every minute, so its run is due. The re-created run is planned
    and worked again; no item done before the loss counts, and the provider's
    idempotency keys stop a second payout. Breaks if the tick does not re-create
    the run or stays silent, or if success were claimed from before the loss.
    """
    settings["provider"] = ProviderState(latency=0.08)  # keys honoured: the ledger is gone
    settings["honours_keys"] = True
    with Cluster(
        tmp_path / "c", prefix, concurrency=concurrency, workers=2, schedule="* * * * *", **settings
    ) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=done(c, run_id))
        restarted = c.restart_redis(empty=True)
        c.lift_hold()
        c.store.close()
        c.store = c.open_store()  # a tick side that remembers nothing
        assert c.drive(run_id, timeout=60) == "succeeded"
        recreated = [d for d in c.decisions if d.kind == "create" and d.run_id == run_id]
        assert len(recreated) == 1 and NO_RECORD in recreated[0].reason, c.decisions
        logged = [e for e in Runs(c.store).decisions(run_id, count=100) if e["kind"] == "create"]
        assert len(logged) == 1 and NO_RECORD in logged[0]["reason"]
        for shard in range(c.config.shards):
            for record in c.store.items(run_id, shard):
                assert record.state == "done"
                assert int(record.result["token"]) == record.token
        summary = c.verify(run_id, loss=(0, restarted))
        assert summary.regranted_after_loss >= 1  # items done before were done again
        evidence = c.evidence(run_id)
        done_at = [r.done_at_ms for r in evidence.records.values()]
        assert all(at is not None and at >= restarted for at in done_at)
        with pytest.raises(Violation):  # tokens did start over: visible without the window
            check(evidence)


# -- scripts flushed ----------------------------------------------------------------------


@pytest.mark.parametrize("times", ["once", "storm"])
def test_scripts_flushed_while_workers_run(
    tmp_path: Path, prefix: str, settings: Any, times: str, concurrency: int
) -> None:
    """SCRIPT FLUSH once, or every ~50 ms for 3 s (30 flushes at least), while the workers
    claim and commit.

    Each NOSCRIPT costs the worker a reload. The flushes fall between the test's
    own ticks: what is under test is the workers' side. Breaks if a flush loses
    or wedges an item, or a reloaded script runs twice where once was meant.
    """
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=2, **settings) as c:
        c.wait_ready()
        run_id = c.start_run()
        c.drive(run_id, until=done(c, run_id))
        first_flush_ms = int(time.time() * 1000)
        c.script_flush()
        c.lift_hold()
        storm_over = for_a_while(3.0 if times == "storm" else 0.0)
        wanted = 30 if times == "storm" else 1  # flushes, however slow the machine is

        def flushed() -> int:
            return sum(1 for f in c.faults if f[1] == "script-flush")

        def flush_twice() -> None:  # the drive ticks every 0.1 s: two flushes between
            if not storm_over() or flushed() < wanted:
                c.script_flush()
                time.sleep(0.05)  # the storm's own pace
                c.script_flush()

        def finished() -> bool:
            storm_done = storm_over() and flushed() >= wanted
            return storm_done and Runs(c.store).info(run_id)["state"] in FINAL_STATES

        c.drive(run_id, timeout=60, until=finished, step=flush_twice)
        assert Runs(c.store).info(run_id)["state"] == "succeeded"
        c.verify(run_id)
        assert flushed() >= wanted
        # Workers called their own scripts (which the test's ticks never load) after a
        # flush and the calls succeeded: a worker met NOSCRIPT, reloaded and went on.
        worker_calls = ("claim_next", "renew", "commit", "record_effect")
        later = [o for o in c.ops() if o.invoked_wall_ms > first_flush_ms]
        assert any(o.get("f") in worker_calls and o.type == "ok" for o in later)
        errors = c.store.client.info("errorstats")
        assert int(errors.get("errorstat_NOSCRIPT", {}).get("count", 0)) >= 1, errors


# -- an evicting memory policy -----------------------------------------------------------


def test_evicting_policy_never_ends_succeeded(
    tmp_path: Path, prefix: str, concurrency: int
) -> None:
    """``allkeys-lru`` with a maxmemory under the use: the LRU keys go, here item records.

    The run is planned and the items then left idle 2 s while every other key
    is touched, so that the eviction falls on the shards' ``items`` hashes; the
    workers start after it. Items vanish: the run must end partial or failed,
    with the loss counted. Breaks if it ends succeeded.
    """
    settings = {"items": 24, "shards": 3, "ttl": 1.5, "payload_bytes": 1500}
    with Cluster(tmp_path / "c", prefix, concurrency=concurrency, workers=0, **settings) as c:
        run_id = c.start_run()
        c.drive(run_id, until=lambda: Runs(c.store).info(run_id)["state"] == "running")
        c.drive(run_id, until=for_a_while(2.2))  # the item records age (LRU clock: 1 s)
        client = c.store.client
        keys = list(client.scan_iter(count=1000))
        items = [k for k in keys if k.endswith(b":items")]
        client.touch(*(k for k in keys if k not in items))
        c.squeeze(keys=2, samples=64)
        gone = [k for k in keys if not client.exists(k)]
        assert len(gone) >= 2 and set(gone) <= set(items), gone  # the LRU keys: items
        for _ in range(2):
            c.start_worker()
        state = c.drive(run_id, timeout=60)
        status = c.store.status(run_id)
        print(f"evicting policy: run {state}, {status.lost} of {status.planned} items lost")
        evicted = {c.store.keys.shard(run_id, n)[2].encode(): n for n in range(3)}
        shards = {evicted[key] for key in gone}
        lost = [i for i in c.planned(run_id) if shard_of(i, 3) in shards]
        assert state in ("partial", "failed") and status.lost == len(lost), (state, status)
        c.verify(run_id, may_lose=True)


def test_a_full_server_without_eviction_refuses_whole_scripts_and_loses_nothing(
    private_redis: Callable[..., Any], prefix: str
) -> None:
    """``noeviction``: a full server refuses a script whole (``OOM``), and nothing is dropped.

    Breaks if a script wrote part of its change before the refusal, or if any key
    of the run went missing under memory pressure.
    """
    server = private_redis(**{"maxmemory-policy": "noeviction"})
    store = LeaseStore.from_url(server.url, prefix=prefix)
    run = "full:2026-12-01"
    store.add(run, [Item(f"i{n}") for n in range(20)], shards=1)
    lease = store.claim(run, "i0", "w", ttl=60)
    used = int(store.client.info("memory")["used_memory"])
    store.client.config_set("maxmemory", str(used + 300_000))

    def dumps() -> dict[bytes, Any]:
        keys = sorted(store.client.scan_iter(match=f"{prefix}:*"))
        return {key: store.client.dump(key) for key in keys}

    refused: RedisLeaseError | None = None
    added = 0
    for batch in range(200):
        before = dumps()
        try:
            store.add(run, [Item(f"big{batch}-{k}", {"pad": "x" * 8_000}) for k in range(5)])
        except RedisLeaseError as error:
            refused = error
            break
        added += 5
    assert refused is not None, "the server never filled up"
    assert "OOM" in str(refused) or "memory" in str(refused), refused
    assert dumps() == before  # the refused add wrote nothing, not even a counter
    # A commit frees an index entry before it writes, so it may finish even when full;
    # either way it is whole: the item is done, or its record is as it was.
    try:
        store.commit(lease, result={"ok": True})
    except RedisLeaseError:
        assert store.item(run, "i0").state == "leased"
    else:
        assert store.item(run, "i0").state == "done"
    store.client.config_set("maxmemory", "0")
    records = list(store.items(run, 0))
    assert len(records) == 20 + added  # nothing was dropped
    assert store.client.info("stats")["evicted_keys"] == 0
    store.client.close()
