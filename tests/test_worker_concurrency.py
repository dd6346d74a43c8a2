"""Concurrency inside a worker: N handlers of a shard job at once, each under its own lease.

Real ``redis-lease worker --concurrency 16`` processes on a real Redis run 2,000
items with a sleepy handler, thread and ``async def`` both: every item is
committed exactly once (checked through the store and the effect ledger's
counts), the number of handlers in flight never exceeds N, and SIGTERM mid-run
loses nothing. In process: a lost lease cancels an async handler's task and
raises LeaseLost in a thread handler at ``check()``, ``effect`` and ``renew``; a
slot whose handler ends starts the next claimed item itself while the loop is in
a round trip; the next batch is claimed while claimed items still wait, never
more than one batch beyond the slots; a stop gives back the items waiting for a
slot; an item whose lease is lost while it waits is not started.

Worker processes import :data:`threads_job` and :data:`async_job` from this
module by path; ``CONC_QUEUE`` names their RQ queue and ``CONC_DELAY`` the
handler's sleep.
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.errors import InvalidInput, LeaseLost
from redis_lease.fleet.capacity.run_capacity import measured
from redis_lease.fleet.jobs.job import Job, JobOptions
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport.shard_jobs import enqueue_shard
from redis_lease.fleet.worker import shard_loop
from redis_lease.fleet.worker.shard_job import ActiveLease, LeaseKeeper, ShardReport, work_shard
from redis_lease.fleet.worker.shard_loop import CLAIM_SPAN, FIRST_CLAIM
from redis_lease.protocol.leases import Item
from tests.fleet_helpers import Processes, all_records, text, wait_for

pytestmark = pytest.mark.slow

THREADS_PATH = f"{__name__}:threads_job"
ASYNC_PATH = f"{__name__}:async_job"
ITEMS = 2000
SHARDS = 2
N = 16
DELAY = float(os.environ.get("CONC_DELAY", "0.01"))

#: Counts a handler in (ARGV[1] = 1) or out (-1); keeps the highest count seen.
IN_FLIGHT = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n > tonumber(redis.call('GET', KEYS[2]) or '0') then redis.call('SET', KEYS[2], n) end
return n
"""


def _job(name: str) -> Job:
    return Job(
        name,
        shards=SHARDS,
        lease_ttl_seconds=10,
        batch_size=20,
        shard_budget_seconds=120,
        max_attempts=5,
        deadline_after=timedelta(minutes=10),
        schedule="0 0 29 2 *",  # 29 February only: nothing falls due by itself
        queue=os.environ.get("CONC_QUEUE", "rltest-concurrency"),
    )


threads_job = _job("conc-threads")
async_job = _job("conc-async")


def effects_key(prefix: str) -> str:
    """The hash of provider calls per idempotency key (the test's fake provider)."""
    return f"{prefix}:conc:effects"


def started_key(prefix: str) -> str:
    """The hash of handler starts per item id."""
    return f"{prefix}:conc:started"


def flight_keys(prefix: str, pid: int) -> list[str]:
    """The in-flight count and its highest value of one worker process."""
    return [f"{prefix}:conc:flight:{pid}", f"{prefix}:conc:flight-max:{pid}"]


@threads_job.planner
@async_job.planner
def plan(business_date: date) -> Iterator[Item]:
    """``ITEMS`` items."""
    for n in range(ITEMS):
        yield Item(f"item-{n:04d}", {"n": n})


@threads_job.handler
def handle_in_thread(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """Counts itself in flight, applies its effect, sleeps, answers with its token."""
    client, prefix = lease.store.client, lease.store.prefix
    flight = flight_keys(prefix, os.getpid())
    client.hincrby(started_key(prefix), item.id, 1)
    client.eval(IN_FLIGHT, 2, *flight, 1)
    try:
        lease.effect(
            "pay", lambda key: client.hincrby(effects_key(prefix), key, 1), honours_keys=True
        )
        time.sleep(DELAY)
    finally:
        client.eval(IN_FLIGHT, 2, *flight, -1)
    return {"pid": os.getpid(), "token": lease.token}


@async_job.handler
async def handle_async(item: Item, lease: ActiveLease) -> dict[str, Any]:
    """The same as an ``async def`` handler: its effect through ``effect_async``."""
    client, prefix = lease.store.client, lease.store.prefix
    flight = flight_keys(prefix, os.getpid())
    await asyncio.to_thread(client.hincrby, started_key(prefix), item.id, 1)
    await asyncio.to_thread(client.eval, IN_FLIGHT, 2, *flight, 1)
    try:

        async def pay(key: str) -> int:
            return int(await asyncio.to_thread(client.hincrby, effects_key(prefix), key, 1))

        await lease.effect_async("pay", pay, honours_keys=True)
        await asyncio.sleep(DELAY)
    finally:
        await asyncio.to_thread(client.eval, IN_FLIGHT, 2, *flight, -1)
    return {"pid": os.getpid(), "token": lease.token}


def planned_run(store: LeaseStore, job: Job, path: str, queue: str) -> str:
    """Creates and plans the job's run and enqueues one shard job per shard."""
    runs = Runs(store)
    run_id, _ = runs.ensure(job, date(2031, 7, 1), runs.server_now())
    assert runs.plan(job, run_id) == ITEMS
    for shard in range(SHARDS):
        enqueue_shard(store, path, queue, run_id, shard, job.options.shard_budget_seconds)
    return run_id


def worker_args(url: str, queue: str, *, simple: bool) -> list[str]:
    """A burst ``redis-lease worker --concurrency N`` command line."""
    args = ["-m", "redis_lease", "--url", url, "worker", "--queue", queue, "--burst"]
    args += ["--concurrency", str(N)]
    return [*args, "--simple"] if simple else args


def assert_each_done_once(store: LeaseStore, run_id: str) -> None:
    """Every item done by one commit under its last token, its effect applied once."""
    status = store.status(run_id)
    assert status.counts == {"pending": 0, "leased": 0, "done": ITEMS, "dead": 0}
    assert status.counters["commits"] == ITEMS
    records = list(all_records(store, run_id))
    assert len(records) == ITEMS
    for record in records:
        assert record.result["token"] == record.token, record
    calls = store.client.hgetall(effects_key(store.prefix))
    assert len(calls) == ITEMS, "one effect key per item"
    assert {int(v) for v in calls.values()} == {1}, "each effect sent once"
    ledger = [record for _, record in store.effects(run_id)]
    assert len(ledger) == ITEMS
    assert {r["state"] for r in ledger} == {"applied"}


def max_in_flight(store: LeaseStore) -> dict[int, int]:
    """The highest number of handlers in flight at once, per worker process."""
    found = {}
    for key in store.client.scan_iter(match=f"{store.prefix}:conc:flight-max:*"):
        found[int(text(key).rsplit(":", 1)[1])] = int(store.client.get(key) or 0)
    return found


@pytest.mark.parametrize(
    ("path", "simple"),
    [(THREADS_PATH, False), (ASYNC_PATH, True)],
    ids=["threads-forking-worker", "async-simple-worker"],
)
def test_concurrency_16_commits_each_item_exactly_once(
    real_store: LeaseStore,
    redis_url: str,
    queue_name: str,
    procs: Processes,
    path: str,
    simple: bool,
) -> None:
    store = real_store
    job = threads_job if path == THREADS_PATH else async_job
    run_id = planned_run(store, job, path, queue_name)
    worker = procs.start(
        [sys.executable, *worker_args(redis_url, queue_name, simple=simple)],
        {"CONC_QUEUE": queue_name},
        "worker",
    )
    assert worker.wait(timeout=240) == 0, procs.log("worker")
    assert_each_done_once(store, run_id)
    peaks = max_in_flight(store)
    assert peaks, "the handlers counted themselves"
    assert max(peaks.values()) <= N, peaks
    assert max(peaks.values()) > N // 2, f"handlers ran {N} at once: {peaks}"
    # Each shard pass recorded its handlers for the capacity planner (--from-run).
    got = measured(store, run_id)
    assert got is not None
    assert got.handled >= ITEMS
    assert got.handler_duration >= DELAY
    assert got.concurrency > 1, "the recorded handler time overlapped"
    if not simple:  # the forked work horses ran the handlers, under the worker's flag
        assert worker.pid not in peaks


def test_sigterm_mid_run_loses_nothing(
    real_store: LeaseStore, redis_url: str, queue_name: str, procs: Processes
) -> None:
    store = real_store
    run_id = planned_run(store, threads_job, THREADS_PATH, queue_name)
    env = {"CONC_QUEUE": queue_name, "CONC_DELAY": "0.05"}
    args = [sys.executable, *worker_args(redis_url, queue_name, simple=True)]
    first = procs.start(args, env, "first")

    def some_done() -> bool:
        return store.status(run_id).counts.get("done", 0) >= 200

    wait_for(some_done, 120, "the first worker to finish 200 items")
    os.kill(first.pid, signal.SIGTERM)
    assert first.wait(timeout=60) == 0, procs.log("first")
    status = store.status(run_id)
    assert status.counts["leased"] == 0, "every claimed item was committed or given back"
    started = {text(k) for k in store.client.hkeys(started_key(store.prefix))}
    done = {r.item_id for r in all_records(store, run_id) if r.state == "done"}
    assert started == done, "every handler started was finished and committed"
    assert len(done) < ITEMS, "the stop came mid-run"

    second = procs.start(args, {"CONC_QUEUE": queue_name}, "second")
    for shard in range(SHARDS):  # the first worker's shard jobs ended stopped: work them again
        enqueue_shard(store, THREADS_PATH, queue_name, run_id, shard, 120)
    assert second.wait(timeout=240) == 0, procs.log("second")
    assert_each_done_once(store, run_id)
    assert store.status(run_id).counters.get("takeovers", 0) == 0, "nothing waited for expiry"


# -- a lost lease stops the work (in process, real Redis, a started keeper) -----------


#: Seconds between a watchful keeper's renewals (:func:`_watchful`).
LOOK_EVERY = 0.05


#: The budget of a pass that ends with an item not due for a minute: the pass waits for it
#: until the budget is spent, so the budget is short (the handlers start within it).
PASS_BUDGET = 10.0


def _watchful(keeper: LeaseKeeper) -> None:
    """Makes ``keeper`` renew every :data:`LOOK_EVERY` seconds whatever its TTL: with a long
    TTL, a lease the test takes away is seen lost at once, and no stall of a busy machine
    lets a lease run out first."""
    keeper.renew_every = keeper.interval = LOOK_EVERY


def _lost_lease_run(store: LeaseStore, job: Job) -> tuple[ShardReport, str]:
    """Works one item of a fresh run while the test takes its lease away."""
    run_id = "lost:2031-07-02"
    store.add(run_id, [Item("only", {"n": 1})], shards=1)
    keeper = LeaseKeeper(store, job.options.lease_ttl_seconds)
    _watchful(keeper)
    keeper.start()
    try:
        report = work_shard(
            store,
            job,
            run_id,
            0,
            worker="w",
            budget=PASS_BUDGET,
            stop=threading.Event(),
            keeper=keeper,
        )
    finally:
        keeper.close()
    return report, run_id


def _take_away(held: list[ActiveLease], running: threading.Event) -> threading.Thread:
    """Once the handler runs, gives its item back behind its back (its lease is lost).

    Due again only in a minute, so that the pass over the shard ends with it.
    """

    def take() -> None:
        assert running.wait(10), "the handler never started"
        held[0].store.release(held[0].lease, delay=60)

    thread = threading.Thread(target=take)
    thread.start()
    return thread


@pytest.mark.parametrize("waits_in", ["handler", "provider-call"])
def test_lost_lease_cancels_an_async_handlers_task(real_store: LeaseStore, waits_in: str) -> None:
    """The task is cancelled at the keeper's next tick, also inside an async provider call."""
    job = Job("lost-async", shards=1, lease_ttl_seconds=30, commit_interval_seconds=0)
    held: list[ActiveLease] = []
    running, cancelled = threading.Event(), threading.Event()
    reached: list[str] = []
    lost_when_cancelled: list[bool] = []

    async def slow(where: str) -> str:
        running.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            lost_when_cancelled.append(held[0].wait_lost(0))
            cancelled.set()
            raise
        reached.append(where)
        return where

    @job.handler
    async def handle(item: Item, lease: ActiveLease) -> str:
        held.append(lease)
        if waits_in == "handler":
            return await slow("after the sleep")
        return str(await lease.effect_async("pay", slow, honours_keys=True))

    taker = _take_away(held, running)
    report, run_id = _lost_lease_run(real_store, job)
    taker.join()
    # Cancelled (the 30 s sleep did not end) because the keeper saw the lease lost.
    assert cancelled.is_set() and not reached
    assert lost_when_cancelled == [True], "cancelled for the lost lease"
    assert (report.stale, report.committed, report.handled) == (1, 0, 1)
    assert real_store.item(run_id, "only").state == "pending"
    if waits_in == "provider-call":  # sent, outcome unknown: reconciled by the next holder
        [(_, record)] = list(real_store.effects(run_id))
        assert record["state"] == "intended"


@pytest.mark.parametrize("call", ["check", "effect", "renew"])
def test_lost_lease_raises_lease_lost_in_a_thread_handler(
    real_store: LeaseStore, call: str
) -> None:
    job = Job(
        "lost-thread", shards=1, lease_ttl_seconds=30, commit_interval_seconds=0, concurrency=4
    )
    held: list[ActiveLease] = []
    running = threading.Event()
    sent: list[str] = []
    raised: list[LeaseLost] = []

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> str:
        held.append(lease)
        running.set()
        assert lease.wait_lost(10), "the keeper saw the lease lost"
        try:
            if call == "check":
                lease.check()
            elif call == "effect":
                lease.effect("pay", sent.append, honours_keys=True)
            else:
                lease.renew()
        except LeaseLost as error:
            raised.append(error)
            raise
        return "not reached"

    taker = _take_away(held, running)
    report, run_id = _lost_lease_run(real_store, job)
    taker.join()
    assert len(raised) == 1 and raised[0].item_id == "only"
    assert sent == [], "no provider call under a lost lease"
    assert (report.stale, report.committed, report.handled) == (1, 0, 1)
    assert real_store.item(run_id, "only").state == "pending"


# -- the option and the flag ----------------------------------------------------------


@pytest.mark.parametrize("value", [0, -1, 257, 2.5, True])
def test_concurrency_out_of_bounds_is_refused(value: Any) -> None:
    with pytest.raises(InvalidInput, match="concurrency must be a whole number from 1 to 256"):
        JobOptions(concurrency=value)


def test_worker_concurrency_flag_is_checked(redis_url: str) -> None:
    args = [sys.executable, "-m", "redis_lease", "--url", redis_url, "worker"]
    done = subprocess.run([*args, "--concurrency", "0"], capture_output=True, text=True)
    assert done.returncode == 2
    assert "concurrency must be a whole number from 1 to 256" in done.stderr


def test_effect_async_awaits_what_a_plain_callable_returns(real_store: LeaseStore) -> None:
    """``call`` and ``lookup`` may be lambdas returning coroutines; an 'intended' record is
    reconciled by the async lookup, not sent again."""
    job = Job("effect-async", shards=1, lease_ttl_seconds=30, commit_interval_seconds=0)
    sent: list[str] = []

    async def provider(key: str) -> dict[str, str]:
        await asyncio.sleep(0)
        sent.append(key)
        return {"id": f"ref-{len(sent)}"}

    async def lookup(key: str) -> dict[str, str] | None:
        await asyncio.sleep(0)
        return {"id": "found"} if key.endswith("|again") else None

    @job.handler
    async def handle(item: Item, lease: ActiveLease) -> dict[str, Any]:
        first = await lease.effect_async("pay", lambda key: provider(key))
        # An earlier attempt of 'again' recorded its intent: the lookup finds it applied.
        real_store.record_effect(
            lease.lease, f"{lease.run_id}|{item.id}|again", "again", "intended"
        )
        second = await lease.effect_async("again", provider, lookup=lambda key: lookup(key))
        return {"first": first, "second": second}

    run_id = "effect-async:2031-07-03"
    real_store.add(run_id, [Item("only")], shards=1)
    report = work_shard(
        real_store,
        job,
        run_id,
        0,
        worker="w",
        budget=30,
        stop=threading.Event(),
        keeper=LeaseKeeper(real_store, 30),
    )
    assert (report.committed, report.handled) == (1, 1), report
    assert real_store.item(run_id, "only").result == {
        "first": {"id": "ref-1"},
        "second": {"id": "found"},
    }
    assert sent == [f"{run_id}|only|pay"], "the reconciled effect was not sent again"


def test_a_commit_refused_after_the_event_loop_closed_is_counted_stale(
    real_store: LeaseStore,
) -> None:
    """The pass's last commits go out after the async pool closed its loop: a refusal
    then marks the lease lost, which must not try to cancel a task on the closed loop."""
    store = real_store
    store.add("r", [Item("a", 1), Item("b", 2)], shards=1)
    job = Job(
        "closed-loop", shards=1, lease_ttl_seconds=60, commit_interval_seconds=5.0, concurrency=1
    )
    stop = threading.Event()

    @job.handler
    async def handle(item: Item, lease: ActiveLease) -> str:
        # The lease ends behind the handler's back (as after an expiry and a takeover).
        await asyncio.to_thread(store.release, lease.lease)
        stop.set()  # budget end or SIGTERM: the loop leaves with this commit still waiting
        # still running when the loop gives back the unstarted item b
        await asyncio.to_thread(wait_for, lambda: store.item("r", "b").state == "pending", 10, "b")
        return "ok"

    keeper = LeaseKeeper(store, 60)  # not started: no renewal marks the lease lost first
    report = work_shard(store, job, "r", 0, worker="w", budget=30, stop=stop, keeper=keeper)
    assert (report.stale, report.committed, report.handled) == (1, 0, 1), report
    assert store.item("r", "a").state == "pending"


# -- slots refill themselves; claims come ahead, bounded ----------------------------


def _nap(item: Item) -> float:
    return 0.004 + int(item.id[1:]) % 5 * 0.003


def _sleepy_job(name: str, kind: str, concurrency: int, started: list[str]) -> Job:
    """A job whose handler (thread or async) records its start and sleeps 4 to 16 ms
    (by item number, so that the slots do not all end together)."""
    job = Job(
        name,
        shards=1,
        lease_ttl_seconds=30,
        batch_size=8,
        commit_interval_seconds=0,
        concurrency=concurrency,
    )
    lock = threading.Lock()

    def note(item: Item) -> None:
        with lock:
            started.append(item.id)

    if kind == "threads":

        @job.handler
        def handle(item: Item, lease: ActiveLease) -> str:
            note(item)
            time.sleep(_nap(item))
            return item.id

    else:

        @job.handler
        async def handle_async(item: Item, lease: ActiveLease) -> str:
            note(item)
            await asyncio.sleep(_nap(item))
            return item.id

    return job


def _work(
    store: LeaseStore, job: Job, run_id: str, keeper: LeaseKeeper, budget: float = 60
) -> ShardReport:
    stop = threading.Event()
    return work_shard(store, job, run_id, 0, worker="w", budget=budget, stop=stop, keeper=keeper)


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_a_slot_that_ends_starts_the_next_item_while_the_loop_waits_on_a_round_trip(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The first commit round trip is held until 8 handlers have started: only slots that
    start waiting items themselves (not the loop thread, stuck in the round trip) get there."""
    store, started = real_store, []
    job = _sleepy_job("refill", kind, 4, started)
    store.add("refill", [Item(f"i{n:02d}") for n in range(16)], shards=1)
    settle_many = store.settle_many
    held_until: list[bool] = []

    def slow_settle_many(requests: Any) -> Any:
        if not held_until:  # the first commit: wait for a second round of starts
            deadline = time.monotonic() + 10
            while len(started) < 8 and time.monotonic() < deadline:
                time.sleep(0.005)
            held_until.append(len(started) >= 8)
        return settle_many(requests)

    monkeypatch.setattr(store, "settle_many", slow_settle_many)
    report = _work(store, job, "refill", LeaseKeeper(store, 30))
    assert held_until == [True], "slots started waiting items while the loop was in a round trip"
    assert (report.committed, report.handled, report.released) == (16, 16, 0), report
    assert sorted(started) == [f"i{n:02d}" for n in range(16)], "each item started once"
    assert store.status("refill").counts["done"] == 16


class _CountingKeeper(LeaseKeeper):
    """A keeper that counts the leases it holds and keeps the highest count."""

    def __init__(self, store: LeaseStore, ttl: float = 30) -> None:
        super().__init__(store, ttl)
        self.held: dict[int, ActiveLease] = {}
        self.peak = 0
        self._count_lock = threading.Lock()

    def hold(self, active: ActiveLease) -> None:
        super().hold(active)
        with self._count_lock:
            self.held[id(active)] = active
            self.peak = max(self.peak, len(self.held))

    def drop(self, active: ActiveLease) -> None:
        super().drop(active)
        with self._count_lock:
            self.held.pop(id(active), None)


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_the_next_batch_is_claimed_while_claimed_items_still_wait_for_a_slot(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """2 slots, batches of 8: the test lets one handler end at a time. The second claim comes
    while claimed items still wait for a slot, and no more than 2 + 8 leases are ever held."""
    store, started, gate = real_store, [], threading.Semaphore(0)
    job = Job(
        "ahead",
        shards=1,
        lease_ttl_seconds=30,
        batch_size=8,
        commit_interval_seconds=0,
        concurrency=2,
    )
    # Claims of the whole batch however long the test holds its handlers (claims are
    # otherwise sized to the handlers' time: test_claims_are_sized_to_the_handler).
    monkeypatch.setattr(shard_loop, "CLAIM_SPAN", 1e3)
    monkeypatch.setattr(shard_loop, "FIRST_CLAIM", 8)

    if kind == "threads":

        @job.handler
        def handle(item: Item, lease: ActiveLease) -> str:
            started.append(item.id)
            assert gate.acquire(timeout=10)
            return item.id

    else:

        @job.handler
        async def handle_async(item: Item, lease: ActiveLease) -> str:
            started.append(item.id)
            assert await asyncio.to_thread(gate.acquire, True, 10)
            return item.id

    store.add("ahead", [Item(f"i{n:02d}") for n in range(12)], shards=1)
    claim_next, claimed = store.claim_next, [0]
    waiting_at_claims: list[int] = []  # claimed items not started yet, at each claim

    def counted_claim_next(*args: Any, **kwargs: Any) -> Any:
        waiting_at_claims.append(claimed[0] - len(started))
        leases = claim_next(*args, **kwargs)
        claimed[0] += len(leases)
        return leases

    monkeypatch.setattr(store, "claim_next", counted_claim_next)
    keeper = _CountingKeeper(store)
    reports: list[ShardReport] = []
    worker = threading.Thread(target=lambda: reports.append(_work(store, job, "ahead", keeper)))
    worker.start()
    try:
        wait_for(lambda: len(started) == 2, 10, "both slots busy", every=0.005)
        for n in range(3, 8):  # one handler ends; its slot starts the next claimed item
            gate.release()
            wait_for(lambda: len(started) == n, 10, f"start number {n}", every=0.005)  # noqa: B023
        wait_for(lambda: len(waiting_at_claims) >= 2, 10, "the second claim", every=0.005)
    finally:
        gate.release(100)
        worker.join(30)
    assert waiting_at_claims[0] == 0
    assert waiting_at_claims[1] >= 1, "claimed while claimed items still waited"
    assert keeper.peak <= 2 + 8, keeper.peak
    [report] = reports
    assert (report.committed, report.handled) == (12, 12), report
    assert sorted(started) == [f"i{n:02d}" for n in range(12)], "each item started once"
    assert not keeper.held, "every lease dropped once settled"


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_a_stop_gives_back_the_items_waiting_in_the_pool_and_starts_none(
    real_store: LeaseStore, kind: str
) -> None:
    store, started = real_store, []
    job = Job(
        "stop",
        shards=1,
        lease_ttl_seconds=30,
        batch_size=8,
        commit_interval_seconds=0,
        concurrency=2,
    )
    stop = threading.Event()

    def begin(item: Item) -> None:
        started.append(item.id)
        stop.set()  # SIGTERM: the first handler to start asks the pass to stop

    if kind == "threads":

        @job.handler
        def handle(item: Item, lease: ActiveLease) -> str:
            begin(item)
            time.sleep(0.1)
            return item.id

    else:

        @job.handler
        async def handle_async(item: Item, lease: ActiveLease) -> str:
            begin(item)
            await asyncio.sleep(0.1)
            return item.id

    store.add("stop", [Item(f"i{n:02d}") for n in range(20)], shards=1)
    keeper = _CountingKeeper(store)
    report = work_shard(store, job, "stop", 0, worker="w", budget=60, stop=stop, keeper=keeper)
    assert report.stopped and 1 <= len(started) <= 2, (report, started)
    assert report.committed == report.handled == len(started), report
    assert report.released == 8 - len(started), "the claimed items not started were given back"
    counts = store.status("stop").counts
    assert counts == {"pending": 20 - len(started), "leased": 0, "done": len(started), "dead": 0}
    done = {r.item_id for r in all_records(store, "stop") if r.state == "done"}
    assert done == set(started)
    assert not keeper.held


@pytest.mark.parametrize("kind", ["threads", "async"])
def test_an_item_whose_lease_is_lost_while_waiting_for_a_slot_is_not_started(
    real_store: LeaseStore, kind: str
) -> None:
    """Both slots are busy until the third item's lease is lost; a slot then skips it."""
    store, started = real_store, []
    job = Job(
        "skip",
        shards=1,
        lease_ttl_seconds=30,
        batch_size=8,
        commit_interval_seconds=0,
        concurrency=2,
    )
    keeper = _CountingKeeper(store, job.options.lease_ttl_seconds)
    _watchful(keeper)
    both, lost = threading.Barrier(2, timeout=10), threading.Event()

    def wait_for_the_loss(item: Item) -> None:
        started.append(item.id)
        if both.wait() == 0:  # one of the two running handlers takes the waiting item away
            [waiting] = [a for a in keeper.held.values() if a.item_id not in started]
            store.release(waiting.lease, delay=60)
            assert waiting.wait_lost(10), "the keeper saw the lease lost"
            lost.set()
        assert lost.wait(10)

    if kind == "threads":

        @job.handler
        def handle(item: Item, lease: ActiveLease) -> str:
            wait_for_the_loss(item)
            return item.id

    else:

        @job.handler
        async def handle_async(item: Item, lease: ActiveLease) -> str:
            await asyncio.to_thread(wait_for_the_loss, item)
            return item.id

    store.add("skip", [Item(f"i{n}") for n in range(3)], shards=1)
    keeper.start()
    try:
        report = _work(store, job, "skip", keeper, budget=PASS_BUDGET)
    finally:
        keeper.close()
    assert len(started) == 2
    # The skipped item's lease was lost to another holder: counted stale, never started.
    assert (report.committed, report.handled, report.stale) == (2, 2, 1), report
    [skipped] = {"i0", "i1", "i2"} - set(started)
    assert store.item("skip", skipped).state == "pending"
    assert not keeper.held


@pytest.mark.parametrize("slots", [1, 4])
@pytest.mark.parametrize("nap", [0.0, 0.05])
def test_claims_are_sized_to_the_handler(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch, nap: float, slots: int
) -> None:
    """batch_size 100: the first claim asks for FIRST_CLAIM items; after it, handlers that do
    nothing get claims of the whole batch, and handlers that take 50 ms claims of about
    slots x CLAIM_SPAN / 50 ms, so that no claimed item waits long under its lease."""
    store = real_store
    job = Job(
        "sized",
        shards=1,
        lease_ttl_seconds=30,
        batch_size=100,
        commit_interval_seconds=0,
        concurrency=slots,
    )

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> str:
        time.sleep(nap)
        return item.id

    count = 260 if nap == 0 else FIRST_CLAIM + 6 * slots
    store.add("sized", [Item(f"i{n:03d}") for n in range(count)], shards=1)
    claim_next, limits, taken = store.claim_next, [], []

    def counted_claim_next(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["limit"])
        leases = claim_next(*args, **kwargs)
        taken.append(len(leases))
        return leases

    monkeypatch.setattr(store, "claim_next", counted_claim_next)
    report = _work(store, job, "sized", LeaseKeeper(store, 30))
    assert (report.committed, report.handled) == (count, count), report
    assert limits[0] == FIRST_CLAIM
    if nap == 0:
        assert limits[1:3] == [100, 100], limits
    else:
        most = math.ceil(slots * CLAIM_SPAN / nap)
        assert max(limits[1:]) <= most, limits
        assert any(n > 0 for n in taken[1:]), (limits, taken)  # a sized claim that took items


def test_claims_shrink_soon_after_the_handler_slows_down(
    real_store: LeaseStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """220 items that take no time, then 40 that take 30 ms: the claims are sized by the
    recent handler time, so the claim after the slow items asks for a few items, not for
    the 44 that the mean over the whole pass would still give."""
    store = real_store
    job = Job("slower", shards=1, lease_ttl_seconds=30, batch_size=100, commit_interval_seconds=0)

    @job.handler
    def handle(item: Item, lease: ActiveLease) -> str:
        if int(item.id[1:]) >= 220:
            time.sleep(0.03)
        return item.id

    store.add("slower", [Item(f"i{n:03d}") for n in range(260)], shards=1)
    claim_next, limits = store.claim_next, []

    def counted_claim_next(*args: Any, **kwargs: Any) -> Any:
        limits.append(kwargs["limit"])
        return claim_next(*args, **kwargs)

    monkeypatch.setattr(store, "claim_next", counted_claim_next)
    report = _work(store, job, "slower", LeaseKeeper(store, 30))
    assert report.committed == 260, report
    # Items 0-219 are fast; the fourth claim, made before any slow item ran, takes the 40
    # slow ones; the claim after them is sized by their time (by the mean over the whole
    # pass, 40 x 30 ms / 260 items, it would ask for 44).
    assert limits[:4] == [FIRST_CLAIM, 100, 100, 100], limits
    assert len(limits) >= 5 and max(limits[4:]) <= 12, limits
