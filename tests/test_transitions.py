"""The ugly transitions, on real worker processes, real Redis and a real HTTP provider.

Each test runs the effects job of tests/effect_jobs.py (or the reservations
cleanup) on ``redis-lease worker --simple`` processes, injects one fault at an
exact point (a handler hook the test holds the process at, or the provider's own
faults), and then checks at the provider, by idempotency key, that every effect
was applied exactly once, and in Redis that every item ended done.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import redis

from redis_lease import LeaseStore
from redis_lease.demo.provider import ProviderClient, ProviderServer, ProviderState, _Handler
from redis_lease.fleet.effects.ledger import idempotency_key
from redis_lease.fleet.effects.provider_gate import ProviderGate
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from tests import effect_jobs
from tests.effect_jobs import (
    EFFECTS_PATH,
    GATE_NAME,
    SEAT_RACE_PATH,
    EffectConfig,
    Workers,
    delete_prefix,
    delete_rq_queue,
    drive,
    make_effects_job,
    notes,
    release_hook,
    start_run,
    wait_for_hook,
    wait_until,
    worker_env,
)
from tests.fleet_helpers import stop_group, wait_for
from tests.redis_server import RedisServer

pytestmark = pytest.mark.slow


@dataclass
class Harness:
    """One test's store, queue, hook directory, provider and worker processes."""

    url: str
    store: LeaseStore
    queue: str
    hooks: Path
    workers: Workers
    providers: list[ProviderServer] = field(default_factory=list)

    def provider(self, state: ProviderState | None = None) -> ProviderServer:
        """Starts a provider on a free loopback port (stopped at teardown)."""
        server = ProviderServer(state=state or ProviderState())
        server.start()
        self.providers.append(server)
        return server

    def config(self, provider: ProviderServer, **settings: Any) -> EffectConfig:
        """The effects job's settings for this test."""
        return EffectConfig(
            queue=self.queue, provider_url=provider.url, hook_dir=str(self.hooks), **settings
        )

    def start(self, config: EffectConfig) -> tuple[Job, str]:
        """The job for ``config`` and its run (planned by the first tick)."""
        job = make_effects_job(config)
        return job, start_run(self.store, job)

    def spawn(self, config: EffectConfig, count: int = 1, url: str | None = None) -> list[int]:
        """Starts workers for ``config``'s queue (on ``url``, default the test's Redis)."""
        return self.workers.start(url or self.url, self.queue, count, **config.env())

    def drive(self, job: Job, run_id: str, path: str = EFFECTS_PATH, **options: Any) -> str:
        """Ticks the run (see effect_jobs.drive); failures show the workers' logs."""
        return drive(self.store, path, job, run_id, describe=self.workers.output, **options)

    def item(self, run_id: str, item_id: str) -> Any:
        """The item's record."""
        return self.store.item(run_id, item_id)

    def counters(self, run_id: str) -> dict[str, int]:
        """The run's event counters."""
        return self.store.status(run_id).counters

    def holders(self, run_id: str) -> set[int]:
        """Indexes of the workers holding a lease on the run now (owner is host:pid:job)."""
        pids = {p.pid: n for n, p in enumerate(self.workers.processes)}
        found = set()
        for shard in range(self.store.shard_count(run_id)):
            for record in self.store.items(run_id, shard):
                if record.state == "leased" and record.owner:
                    pid = int(record.owner.split(":")[-2])
                    if pid in pids:
                        found.add(pids[pid])
        return found


@pytest.fixture
def harness(redis_url: str, prefix: str, tmp_path: Path) -> Iterator[Harness]:
    """Everything a transition test needs; kills and deletes all of it afterwards."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    store = LeaseStore.from_url(redis_url, prefix=prefix)
    h = Harness(redis_url, store, f"{prefix}-q", hooks, Workers(logs, worker_env()))
    try:
        yield h
    finally:
        h.workers.close()
        for server in h.providers:
            server.shutdown()
            server.server_close()
        delete_rq_queue(store.client, h.queue)
        delete_prefix(store.client, prefix)
        store.client.close()


def effect_key(run_id: str, item_id: str) -> str:
    """The idempotency key the effects job sends for an item."""
    return idempotency_key(run_id, item_id, "payout")


def all_items(store: LeaseStore, run_id: str) -> list[Any]:
    """Every item record of the run."""
    return [r for s in range(store.shard_count(run_id)) for r in store.items(run_id, s)]


def assert_once_each(h: Harness, server: ProviderServer, run_id: str, items: int) -> None:
    """Every item done, and the provider applied each item's effect exactly once."""
    stats = ProviderClient(server.url).stats()
    records = all_items(h.store, run_id)
    assert len(records) == items
    assert {r.state for r in records} == {"done"}, [(r.item_id, r.state) for r in records]
    assert stats["duplicate_effects"] == 0, stats
    assert stats["applications"] == items, stats
    applied = server.state.applications
    assert sorted(applied) == sorted(effect_key(run_id, r.item_id) for r in records)
    assert set(applied.values()) == {1}
    for record in records:  # the committed reference is the provider's one
        key = effect_key(run_id, record.item_id)
        assert record.result["reference"] == server.state.records[key]["id"]


def requests_for(server: ProviderServer, run_id: str, item_id: str) -> int:
    """POSTs the provider received for an item's key."""
    return server.state.requests.get(effect_key(run_id, item_id), 0)


# -- 1. a holder paused past its lease ------------------------------------------------


@pytest.mark.parametrize("point", ["before_effect", "before_call"])
def test_paused_holder_resumes_after_takeover_and_is_fenced(harness: Harness, point: str) -> None:
    """SIGSTOP a holder past its lease; another worker takes over and completes; then SIGCONT.

    Paused before its effect, the resumed worker finds its lease gone and stops
    before sending or writing anything; paused after its intent, its late request
    carries the same key and the provider dedupes it. Either way nothing it writes lands.
    """
    h = harness
    server = h.provider()
    config = h.config(server, items=4, ttl=1.5, pause_at=(point,))
    job, run_id = h.start(config)
    h.spawn(config, 2)
    h.drive(job, run_id, until=lambda: (h.hooks / f"{point}.at").exists())
    paused = wait_for_hook(h.hooks, point)
    index = h.workers.index_of(paused["pid"])
    stop_group(h.workers.processes[index].pid)  # every thread stopped before the go
    release_hook(h.hooks, point)  # seen only once the process runs again

    assert h.drive(job, run_id, timeout=60) == "succeeded"
    taken = h.item(run_id, paused["item"])
    assert taken.state == "done" and taken.token > paused["token"]
    assert h.counters(run_id).get("takeovers", 0) >= 1
    requests_before = requests_for(server, run_id, paused["item"])
    assert requests_before == 1

    # Resumed before its effect, the holder stops at lease.effect with LeaseLost and writes
    # nothing: its lease ran out by its own clock, or the keeper's renewal (which may wake
    # first) was refused. Resumed after its intent, its late request goes out with the key.
    h.workers.signal(index, signal.SIGCONT)
    if point == "before_call":
        wait_until(lambda: h.counters(run_id).get("stale_effects", 0) >= 1, 30, "stale_effects")
    else:
        wait_until(
            lambda: any(
                (n["pid"], n["item"]) == (paused["pid"], paused["item"])
                for n in notes(h.hooks, "lease_lost")
            ),
            30,
            "the resumed holder stopping with LeaseLost",
        )

    after = h.item(run_id, paused["item"])
    assert (after.state, after.token, after.result) == ("done", taken.token, taken.result)
    late_requests = 1 if point == "before_call" else 0
    assert requests_for(server, run_id, paused["item"]) == 1 + late_requests
    record = h.store.effect(run_id, paused["item"], effect_key(run_id, paused["item"]))
    assert record is not None and record["state"] == "applied"
    assert record["token"] == taken.token
    assert_once_each(h, server, run_id, config.items)


# -- 2. the provider accepts and the response is lost -------------------------------


@pytest.mark.parametrize("fault", ["timeout_after_accept", "lose_response"])
def test_ambiguous_answer_is_reconciled_not_reissued(harness: Harness, fault: str) -> None:
    """The provider applies and then times out (or drops the answer); keys are not honoured.

    The ledger records the effect as unknown; the next attempt asks the provider
    by key, finds it applied and sends nothing again.
    """
    h = harness
    server = h.provider(ProviderState(honour_keys=False, hold_seconds=1.0, faults={fault: 1}))
    config = h.config(server, items=4, provider_timeout=0.3, honours_keys=False)
    job, run_id = h.start(config)
    h.spawn(config)
    assert h.drive(job, run_id, timeout=60) == "succeeded"

    assert server.state.faults[fault] == 0  # the fault did fire
    records = all_items(h.store, run_id)
    assert all(requests_for(server, run_id, r.item_id) == 1 for r in records)
    retried = [r for r in records if r.attempts == 2]
    assert len(retried) == 1, [(r.item_id, r.attempts) for r in records]
    ledger = h.store.effect(run_id, retried[0].item_id, effect_key(run_id, retried[0].item_id))
    assert ledger is not None
    assert (ledger["state"], ledger["attempts"], ledger["token"]) == ("applied", 1, 2)
    assert "EffectUnknown" in ledger["error"]
    status = h.store.status(run_id)
    assert status.counters["effects_reconciled"] == 1
    assert status.counters["retries"] == 1
    assert status.counters.get("effects_unknown", 0) == 0
    assert status.oldest_unknown_effect_age_seconds == 0
    assert_once_each(h, server, run_id, config.items)


# -- 3. a worker killed before, during and after the provider call -----------------


@pytest.mark.parametrize("point", ["before_call", "during_call", "after_call", "after_effect"])
def test_killed_worker_is_recovered_without_second_effect(harness: Harness, point: str) -> None:
    """SIGKILL the holder at a point of its effect; the next owner finishes the item.

    The provider does not honour keys, so only the ledger and the lookup stand
    between a retry and a second payout.
    """
    h = harness
    during = point == "during_call"
    state = ProviderState(honour_keys=False)
    if during:  # apply, then hold the answer; the worker's client waits longer than that
        state.faults["timeout_after_accept"] = 1
        state.hold_seconds = 3.0
    server = h.provider(state)
    config = h.config(
        server, items=4, ttl=1.5, honours_keys=False, pause_at=() if during else (point,)
    )
    job, run_id = h.start(config)
    h.spawn(config, 2)
    if during:
        h.drive(job, run_id, until=lambda: len(server.state.applications) == 1)
        assert server.state.in_flight == 1
        (victim,) = h.holders(run_id)
        (item,) = [
            r.item_id
            for r in all_items(h.store, run_id)
            if effect_key(run_id, r.item_id) in server.state.applications
        ]
        token = h.item(run_id, item).token
    else:
        h.drive(job, run_id, until=lambda: (h.hooks / f"{point}.at").exists())
        stopped = wait_for_hook(h.hooks, point)
        victim, item, token = h.workers.index_of(stopped["pid"]), stopped["item"], stopped["token"]
    assert h.item(run_id, item).state == "leased"
    h.workers.kill(victim)

    assert h.drive(job, run_id, timeout=60) == "succeeded"
    final = h.item(run_id, item)
    assert final.token > token
    ledger = h.store.effect(run_id, item, effect_key(run_id, item))
    assert ledger is not None and ledger["state"] == "applied"
    # Intents recorded: the killed attempt's, plus a second one only when nothing was sent.
    assert ledger["attempts"] == (2 if point == "before_call" else 1)
    events = h.counters(run_id)
    assert events["takeovers"] >= 1
    if point in ("during_call", "after_call"):
        assert events["effects_reconciled"] >= 1
    records = all_items(h.store, run_id)
    assert all(requests_for(server, run_id, r.item_id) == 1 for r in records)
    assert_once_each(h, server, run_id, config.items)


# -- 4. the final status write fails ----------------------------------------------------


@pytest.mark.parametrize("point", ["after_call", "after_effect"])
def test_failed_status_write_leaves_item_recoverable(
    harness: Harness, private_redis: Callable[..., RedisServer], prefix: str, point: str
) -> None:
    """Cut the holder's Redis connection after the provider call; the next owner finishes.

    The holder logs in as its own ACL user on a private server; the test turns
    the user off and kills its connections, so the holder's next write (the
    ledger's ``applied`` or the commit) fails while every other client goes on.
    """
    server_redis = private_redis()
    admin = redis.Redis.from_url(server_redis.url)
    password = uuid.uuid4().hex
    admin.execute_command("ACL", "SETUSER", "cut", "on", f">{password}", "~*", "&*", "+@all")
    cut_url = server_redis.url.replace("redis://", f"redis://cut:{password}@")
    h = replace(harness, url=server_redis.url, store=LeaseStore.from_url(server_redis.url, prefix))
    try:
        server = h.provider()
        server.state.honour_keys = False
        config = h.config(server, items=3, ttl=1.5, honours_keys=False, pause_at=(point,))
        job, run_id = h.start(config)
        (first,) = h.spawn(config, url=cut_url)
        h.drive(job, run_id, until=lambda: (h.hooks / f"{point}.at").exists())
        stopped = wait_for_hook(h.hooks, point)
        assert h.workers.index_of(stopped["pid"]) == first

        admin.execute_command("ACL", "SETUSER", "cut", "off")
        admin.execute_command("CLIENT", "KILL", "USER", "cut")
        cut = h.item(run_id, stopped["item"])
        assert cut.state == "leased" and cut.expires_at_ms is not None  # recoverable
        release_hook(h.hooks, point)
        h.spawn(config)  # the next owner, on the default user

        assert h.drive(job, run_id, timeout=60) == "succeeded"
        final = h.item(run_id, stopped["item"])
        assert final.token > stopped["token"]  # the cut holder's commit never landed
        # the cut holder's write was refused: it says so once its lease has run out by its
        # own clock (it sends the write again until then), which may be after the run ended
        path = h.workers.logs / f"worker-{first}.log"
        deadline = time.monotonic() + 15
        while "RedisUnavailable" not in path.read_text(errors="replace"):
            assert time.monotonic() < deadline, path.read_text(errors="replace")[-3000:]
            time.sleep(0.1)
        ledger = h.store.effect(run_id, stopped["item"], effect_key(run_id, stopped["item"]))
        assert ledger is not None
        assert (ledger["state"], ledger["attempts"]) == ("applied", 1)
        if point == "after_call":
            assert h.counters(run_id)["effects_reconciled"] >= 1
        assert requests_for(server, run_id, stopped["item"]) == 1
        assert_once_each(h, server, run_id, config.items)
    finally:
        h.workers.close()
        h.store.client.close()
        admin.close()


# -- 5. the provider throttles a burst ------------------------------------------------


class TimedHandler(_Handler):
    """The provider's handler, recording when each correction is taken up and answered.

    The interval runs from the start of its processing to the start of its answer,
    so it lies inside the time its caller holds a gate slot.
    """

    server: TimedServer

    def _correction(self, state: ProviderState, key: str, body: Any, overloaded: bool) -> None:
        self._started = time.monotonic()
        super()._correction(state, key, body, overloaded)

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        started = getattr(self, "_started", None)
        if started is not None:
            self.server.intervals.append((started, time.monotonic()))
            del self._started
        super()._send(status, body, headers)


class TimedServer(ProviderServer):
    """A provider that keeps the processing interval of every correction."""

    def __init__(self, state: ProviderState) -> None:
        super().__init__(state=state)
        self.RequestHandlerClass = TimedHandler
        self.intervals: list[tuple[float, float]] = []

    def in_flight_at_arrivals(self) -> list[tuple[float, int]]:
        """For each correction: when it arrived and how many were in process then."""
        spans = sorted(self.intervals)
        return [(start, sum(1 for s, e in spans if s <= start < e)) for start, _ in spans]


class CapSampler(threading.Thread):
    """Samples a gate's cap and change counter every few milliseconds."""

    def __init__(self, url: str, state_key: str, max_cap: int) -> None:
        super().__init__(name="cap-sampler", daemon=True)
        self.client = redis.Redis.from_url(url)
        self.state_key = state_key
        self.max_cap = max_cap
        #: (time before the read, time after it, cap, cap changes so far)
        self.samples: list[tuple[float, float, int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            before = time.monotonic()
            cap, changes = self.client.hmget(self.state_key, ["cap", "cap_changes"])
            if cap is not None:
                self.samples.append((before, time.monotonic(), int(cap), int(changes or 0)))
            self.done.wait(0.003)

    def stop(self) -> None:
        """Stops sampling."""
        self.done.set()
        self.join(timeout=5)
        self.client.close()

    def cap_bound(self, start: float, end: float) -> int:
        """The highest cap that can have been in force at any moment in [start, end].

        Before the first sample it is the max cap. Between two samples the cap may
        have changed unseen: of k changes there, the first k - 1 raise it by one at most.
        """
        if not self.samples or start < self.samples[0][0]:
            return self.max_cap
        bound = 0
        for first, second in zip(self.samples, self.samples[1:], strict=False):
            if second[1] < start or first[0] > end:
                continue
            cap0, cap1, changes = first[2], second[2], second[3] - first[3]
            bound = max(bound, cap0, cap1, cap0 + max(0, changes - 1))
        return min(bound, self.max_cap)


def test_throttled_burst_lowers_cap_and_stays_within_it(harness: Harness) -> None:
    """Four workers, a gate that starts at 4 and a provider that tolerates 2 in flight.

    The provider's 429s halve the gate's cap and pause it. No correction is ever
    in process at the provider beyond the cap that was in force when its slot was
    granted (a grant precedes its arrival by less than ``window`` seconds), nor
    beyond the gate's max cap.
    """
    window, max_cap = 0.5, 4
    h = harness
    server = TimedServer(ProviderState(max_in_flight=2, latency=0.06, retry_after=0.3))
    server.start()
    h.providers.append(server)
    config = h.config(server, items=60, shards=4, ttl=5.0, gate_cap=max_cap, slot_wait=2.0)
    job, run_id = h.start(config)
    gate = ProviderGate(h.store, GATE_NAME, max_concurrency=max_cap)
    sampler = CapSampler(h.url, gate.keys[1], max_cap)
    sampler.start()
    try:
        h.spawn(config, 4)
        assert h.drive(job, run_id, timeout=90) == "succeeded"
    finally:
        sampler.stop()

    gate_state = gate.state()
    caps = [cap for *_, cap, _ in sampler.samples]
    assert gate_state.throttles > 0
    assert gate_state.throttles == server.state.throttled  # every 429 reached the gate
    assert min(caps) < max_cap == max(caps) == gate_state.max_cap
    assert gate_state.counters["peak_in_use"] <= max_cap
    arrivals = server.in_flight_at_arrivals()
    assert len(arrivals) == server.state.throttled + config.items
    assert max(n for _, n in arrivals) <= max_cap
    first_drop = next(before for before, _, cap, _ in sampler.samples if cap < max_cap)
    after_drop = 0
    for arrived, in_flight in arrivals:
        bound = sampler.cap_bound(arrived - window, arrived)
        assert in_flight <= bound, (round(arrived - first_drop, 3), in_flight, bound)
        after_drop += arrived > first_drop + window
    assert after_drop > 0  # corrections did arrive under the lowered cap
    assert_once_each(h, server, run_id, config.items)


# -- 6. a reservation renewed after its cleanup message was queued ------------------


def seats_prefix(prefix: str) -> str:
    """The seat data's own prefix: the application's keys, outside the store's (guarded
    writes may not touch keys under the store's prefix without the shard's hash tag)."""
    return f"{prefix}-seats"


@pytest.fixture
def seats(harness: Harness, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The reservations example's module, with this test's key prefix and Redis."""
    reservations = effect_jobs._reservations()
    monkeypatch.setattr(reservations, "PREFIX", seats_prefix(prefix))
    monkeypatch.setenv("RESERVATIONS_REDIS_URL", harness.url)
    yield reservations
    client = harness.store.client
    keys = list(client.scan_iter(match=f"{seats_prefix(prefix)}:*", count=1000))
    if keys:
        client.delete(*keys)


def seat_env(h: Harness, prefix: str) -> dict[str, str]:
    """The reservations job's settings for worker processes."""
    return {
        "RESERVATIONS_PREFIX": seats_prefix(prefix),
        "RESERVATIONS_QUEUE": h.queue,
        "RESERVATIONS_REDIS_URL": h.url,
    }


def make_holds(client: redis.Redis, seats: Any, expired: int, now_ms: int) -> list[str]:
    """``expired`` holds that expired a minute ago, one per seat of course c0."""
    ids = [f"h{n}" for n in range(expired)]
    pipe = client.pipeline()
    for hold in ids:
        pipe.hset(
            seats.hold_key(hold),
            mapping={
                "state": "held",
                "course": "c0",
                "seat": f"seat-{hold}",
                "version": "1",
                "expires_at": str(now_ms - 60_000),
            },
        )
        pipe.sadd(seats.seats_key("c0", "held"), f"seat-{hold}")
    pipe.execute()
    return ids


def queue_messages(client: redis.Redis, seats: Any, holds: list[str], twice: set[str]) -> int:
    """One cleanup message per hold (two for those in ``twice``); returns the count."""
    messages = []
    for hold in holds:
        expires = client.hget(seats.hold_key(hold), "expires_at")
        assert expires is not None
        for copy in range(2 if hold in twice else 1):
            messages.append(
                json.dumps(
                    {
                        "msg": f"{hold}-m{copy}",
                        "hold": hold,
                        "version": "1",
                        "expires_at": expires.decode(),
                    }
                )
            )
    client.rpush(seats.messages_key(), *messages)
    return len(messages)


def renew(client: redis.Redis, seats: Any, hold: str, now_ms: int) -> None:
    """A learner renews a hold: a new expiry and the next version."""
    client.hset(seats.hold_key(hold), mapping={"expires_at": str(now_ms + 600_000), "version": "2"})


def server_ms(client: redis.Redis) -> int:
    """The Redis server clock in ms."""
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def assert_seat(client: redis.Redis, seats: Any, hold: str, state: str) -> None:
    """The hold is in ``state`` and its seat in exactly the matching set."""
    record = {k.decode(): v.decode() for k, v in client.hgetall(seats.hold_key(hold)).items()}
    seat = record["seat"]
    held = bool(client.sismember(seats.seats_key("c0", "held"), seat))
    free = bool(client.sismember(seats.seats_key("c0", "free"), seat))
    assert record["state"] == state, (hold, record)
    assert (held, free) == ((True, False) if state == "held" else (False, True)), hold


def test_hold_renewed_after_message_was_queued_is_not_released(
    harness: Harness, seats: Any, prefix: str
) -> None:
    """Messages for eight expired holds (one twice) are queued; learners renew two of them.

    Real workers run the reservations example's cleanup: the six still expired
    are released once, the renewed two are left held, the repeat finds its work done.
    """
    h = harness
    client = h.store.client
    holds = make_holds(client, seats, 8, server_ms(client))
    queued = queue_messages(client, seats, holds, twice={"h1"})
    job = effect_jobs.clone_job(seats.cleanup, queue=h.queue, schedule=effect_jobs.NEVER)
    run_id = start_run(h.store, job)
    path = "reservations:cleanup"
    h.drive(job, run_id, path=path, until=lambda: Runs(h.store).info(run_id)["state"] == "running")
    assert h.store.status(run_id).total == queued == 9
    renewed = {"h2", "h5"}
    for hold in renewed:
        renew(client, seats, hold, server_ms(client))
    h.workers.env = worker_env(effect_jobs.RESERVATIONS_DIR)
    h.workers.start(h.url, h.queue, 2, **seat_env(h, prefix))

    assert h.drive(job, run_id, path=path, timeout=60) == "succeeded"
    events = h.counters(run_id)
    assert events["outcome_released"] == 6
    assert events["outcome_renewed"] == 2
    assert events["outcome_already_handled"] == 1
    for hold in holds:
        assert_seat(client, seats, hold, "held" if hold in renewed else "released")
    for hold in renewed:
        assert client.hget(seats.hold_key(hold), "version") == b"2"


def test_renewal_between_reread_and_commit_fails_condition_then_reads_renewed(
    harness: Harness, seats: Any, prefix: str
) -> None:
    """The learner renews while the worker stands between its re-read and its commit.

    The guarded release fails its condition, the item is released and read
    again, and this time the handler answers ``renewed``.
    """
    h = harness
    client = h.store.client
    (hold,) = make_holds(client, seats, 1, server_ms(client))
    queue_messages(client, seats, [hold], twice=set())
    job = effect_jobs.make_seat_race_job(h.queue, str(h.hooks))
    run_id = start_run(h.store, job)
    h.workers.env = worker_env(effect_jobs.RESERVATIONS_DIR)
    config = EffectConfig(queue=h.queue, hook_dir=str(h.hooks))
    h.workers.start(h.url, h.queue, 1, **config.env(), **seat_env(h, prefix))
    h.drive(
        job,
        run_id,
        path=SEAT_RACE_PATH,
        until=lambda: (h.hooks / "before_commit.at").exists(),
    )
    stopped = wait_for_hook(h.hooks, "before_commit")
    renew(client, seats, hold, server_ms(client))
    release_hook(h.hooks, "before_commit")

    assert h.drive(job, run_id, path=SEAT_RACE_PATH, timeout=60) == "succeeded"
    events = h.counters(run_id)
    assert events["releases"] >= 1  # the failed condition gave the item back
    assert events.get("outcome_released", 0) == 0
    assert events["outcome_renewed"] == 1
    record = h.item(run_id, stopped["item"])
    assert record.state == "done" and record.result["outcome"] == "renewed"
    assert record.result["version"] == "2"
    assert_seat(client, seats, hold, "held")


def test_harness_cleans_up_its_rq_keys(redis_url: str, prefix: str, tmp_path: Path) -> None:
    """delete_rq_queue leaves nothing of a queue's jobs, registries or workers behind."""
    client = redis.Redis.from_url(redis_url)
    queue = f"{prefix}-q"
    server = ProviderServer().start()
    workers = Workers(tmp_path, worker_env())
    store = LeaseStore(client, prefix=prefix)
    try:
        config = EffectConfig(queue=queue, provider_url=server.url, items=2)
        job = make_effects_job(config)
        run_id = start_run(store, job)
        workers.start(redis_url, queue, 1, **config.env())
        drive(store, EFFECTS_PATH, job, run_id, timeout=60, describe=workers.output)
        # the run ends with its last commit, before RQ files its shard job as finished
        finished = f"rq:finished:{queue}"
        wait_for(lambda: client.zcard(finished) > 0, 30, "RQ to file a shard job as finished")
        workers.close()  # SIGKILL: the worker leaves its registration behind
        job_ids = {j.decode() for j in client.zrange(finished, 0, -1)}
        names = {queue, *job_ids}
        names |= {
            w.decode().removeprefix("rq:worker:") for w in client.smembers(f"rq:workers:{queue}")
        }
        assert job_ids and len(names) > 1 + len(job_ids)

        def related() -> list[str]:
            keys = (k.decode() for k in client.scan_iter(match="rq:*", count=1000))
            return [k for k in keys if names & set(k.split(":"))]

        assert any(k.startswith("rq:job:") for k in related())
        assert any(k.startswith("rq:worker:") for k in related())
        delete_rq_queue(client, queue)
        assert related() == []
        assert not client.sismember("rq:queues", f"rq:queue:{queue}")
        assert not {f"rq:worker:{n}".encode() for n in names} & client.smembers("rq:workers")
    finally:
        workers.close()
        server.shutdown()
        server.server_close()
        delete_rq_queue(client, queue)
        delete_prefix(client, prefix)
        client.close()
