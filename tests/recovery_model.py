"""A model-based test of the recovery paths: random interleavings of ticks by would-be
leaders at advancing dates, leadership changes, workers that die or pause, keys deleted, the
data set flushed, retention's end and a failed Redis call, over the real scripts on a real
Redis, with the promise checked after every step.

Hypothesis's stateful testing drives :class:`RecoveryModel`; ``tests/test_recovery_model.py``
runs it in the suite at a small size and ``make chaos`` much longer (``MODEL_EXAMPLES``,
``MODEL_STEPS``). The invariants (:meth:`RecoveryModel.promise`):

- a business date's effect is applied at most once at a provider that does not dedupe by
  key (the handler declares ``lookup=`` or nothing, never ``honours_keys=True``). A worker
  here pauses or dies before its call or after the provider applied it, never inside the
  call: a call still on its way when its item is taken over is the one case a lookup cannot
  see (docs/concepts/effects-and-idempotency.md);
- a run that ended is never made again;
- a run lost while open is made again or named lost, and stays named;
- no run is ``succeeded`` with an item not done.

The nightly job of ``tests/fleet_jobs.py`` is ticked; the model's workers run its items
in-process through :func:`redis_lease.fleet.effects.ledger.apply_effect` against
:class:`Provider`, which counts every call it applied by idempotency key. Tick sides share
the memory file (``REDIS_LEASE_MARK_FILE``), as ticks on one machine do.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, time, timedelta
from typing import Any

import redis
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from redis_lease import LeaseStore, RedisLeaseError
from redis_lease.errors import HandlerError, LeaseLost
from redis_lease.fleet.effects.ledger import apply_effect
from redis_lease.fleet.loss import tick_memory
from redis_lease.fleet.loss.lost_records import read as read_lost
from redis_lease.fleet.loss.lost_runs import MADE_AGAIN
from redis_lease.fleet.runs.job_tallies import counted_runs_key
from redis_lease.fleet.runs.lifecycle import Decision, Runs
from redis_lease.fleet.runs.run_states import FINAL_STATES, OPEN_STATES
from redis_lease.fleet.tick.scheduler_tick import tick
from redis_lease.protocol.leases import Lease
from redis_lease.protocol.store.leader import (
    Leadership,
    fence_floor,
    hold_leadership,
    release_leadership,
)
from tests.fleet_helpers import NIGHTLY_PATH
from tests.helpers import keys_under
from tests.redis_faults import FailingCalls, client_calls

#: The first business date ticked (the model's clock starts at its 02:00 UTC).
START = datetime.now(UTC).date() + timedelta(days=1)
#: Seconds a leader's lease lives (the model changes leaders by hand, never by expiry).
LEADER_TTL_MS = 600_000
#: Seconds an item's lease lives (the model ends a dead worker's leases by hand).
ITEM_TTL = 600.0
EFFECT = "pay"
#: The job's retention in the model (its ``retention_days``, set by the test).
RETENTION = timedelta(days=1)
#: How a model worker's handler ends (see :meth:`RecoveryModel.work`).
HANDLER_ENDS = ["done", "done", "done", "sent", "killed in call", "paused", "dead"]
#: Decisions that make a run.
MAKING = ("create", "catch_up", "rerun")
#: What the model did and saw, over every example of a process (a long run prints it).
TALLY: Counter[str] = Counter()


class Provider:
    """A payment provider that does not dedupe by key: every call is applied; ``lookup``
    finds what was applied under a key."""

    def __init__(self) -> None:
        self.applied: Counter[str] = Counter()

    def pay(self, key: str) -> dict[str, Any]:
        self.applied[key] += 1
        return {"ref": f"{key}#{self.applied[key]}"}

    def lookup(self, key: str) -> dict[str, Any] | None:
        return {"ref": f"{key}#1"} if self.applied[key] else None


@dataclass
class Held:
    """A lease a model worker holds, and how far its handler got."""

    lease: Lease
    owner: str
    sent: bool = False


@dataclass
class RunFacts:
    """What the model saw of one run id."""

    ended: bool = False  # seen in a final state
    ended_at: datetime | None = None  # the model's clock when first seen so
    named: bool = False  # named lost by a tick
    open_when_lost: bool = False  # lost while open, and not seen made again since
    made: int = 0  # decisions that made it
    made_after_end: list[str] = field(default_factory=list)  # made after it ended or was named


class RecoveryModel(RuleBasedStateMachine):
    """The steps and the promise; see the module's docstring."""

    #: Set by the test before running: the Redis URL and a base for each example's prefix.
    redis_url = ""
    base_prefix = ""
    #: How the handler settles doubt: ``lookup`` or ``nothing`` (NeedsReconciliation).
    effects = "lookup"

    def __init__(self) -> None:
        super().__init__()
        self.prefix = f"{self.base_prefix}-{uuid.uuid4().hex[:8]}"
        self.sides = [LeaseStore.from_url(self.redis_url, prefix=self.prefix) for _ in range(3)]
        self.calls: list[FailingCalls] = [client_calls(s.client) for s in self.sides]
        self.admin = redis.Redis.from_url(self.redis_url)
        self.now = datetime.combine(START, time(2, 0, 30), UTC)
        self.leader: int | None = None
        self.at_least = 1
        self.leaderships: dict[int, Leadership] = {}
        self.provider = Provider()
        self.held: list[Held] = []
        self.paused: list[Held] = []
        self.runs: dict[str, RunFacts] = {}
        self.steps: list[str] = []

    # -- ticks and leaders -------------------------------------------------------------------

    @initialize()
    def first_leader(self) -> None:
        """Worker 0 leads and ticks at the first date's scheduled time."""
        self.leadership_changes(0)
        self._tick(0, None, False)

    @rule(side=st.integers(0, 2), hours=st.sampled_from([0, 0, 1, 1, 2, 3, 7, 22, 26, 49]))
    def tick(self, side: int, hours: int) -> None:
        """A would-be leader ticks (the clock moves on first): fenced off unless it leads."""
        self.now += timedelta(hours=hours)
        self._tick(side, None, False)

    @rule(side=st.integers(0, 2), nth=st.integers(1, 60), lose_reply=st.booleans())
    def tick_with_a_failed_call(self, side: int, nth: int, lose_reply: bool) -> None:
        """A tick whose ``nth`` Redis call fails (before it is sent, or its reply lost)."""
        self.now += timedelta(minutes=5)
        self._tick(side, nth, lose_reply)
        # a lock whose reply was lost is held until its time to live ends: as then
        store = self.sides[side]
        self.admin.delete(store.keys.job_tick_lock("nightly"))
        for run_id in self.runs:
            self.admin.delete(store.keys.run_planner(run_id))

    @rule(side=st.integers(0, 2))
    def leadership_changes(self, side: int) -> None:
        """The leader lets go (or is taken for dead) and ``side`` takes the lease."""
        store = self.sides[side]
        if self.leader is not None:
            old = self.sides[self.leader]
            release_leadership(old, str(self.leader))
            tick_memory.distrust(old)  # what a leader does when its leadership ends
        lease = hold_leadership(store, str(side), LEADER_TTL_MS)
        assert lease.held
        tick_memory.distrust(store)  # a leadership that begins after a break
        self.at_least = 1
        self.leader = side
        self.leaderships[side] = Leadership(str(side), lease.token)
        self.steps.append(f"leader {side} token {lease.token}")

    def _tick(self, side: int, nth: int | None, lose_reply: bool) -> None:
        store = self.sides[side]
        if side == self.leader:  # the leader renews its lease (every 2 s, between ticks)
            lease = hold_leadership(store, str(side), LEADER_TTL_MS, self.at_least)
            assert lease.held, "the model's leader lost its lease"
            self.leaderships[side] = Leadership(str(side), lease.token)
        leadership = self.leaderships.get(side)
        if leadership is None:
            return  # never led: a worker without the lease does not tick
        decisions: list[Decision] = []
        with self.calls[side].failing(nth, lose_reply), contextlib.suppress(RedisLeaseError):
            decisions = tick(store, [NIGHTLY_PATH], now=self.now, leader=leadership)
            TALLY.update(f"decision {d.kind}" for d in decisions)
            for d in decisions:
                facts = self.runs.setdefault(d.run_id, RunFacts()) if ":" in d.run_id else None
                if facts is not None and d.kind in MAKING:
                    facts.made += 1
                    if facts.ended or facts.named:
                        facts.made_after_end.append(f"{d.kind} at {self.now} by {side}")
                if facts is not None and d.kind == "lost":
                    facts.named = True
        if side == self.leader and any(d.kind == "not_leader" for d in decisions):
            # what the tick leader does: its next hold asks for a token past the job's fence
            # (a stale leader's tick raised it after the lease's hash was lost)
            self.at_least = fence_floor(store, ["nightly"])
            tick_memory.distrust(store)
        TALLY["ticks"] += 1
        TALLY["ticks with a failed call"] += self.calls[side].failed
        shown = "; ".join(f"{d.kind} {d.run_id}" for d in decisions if d.kind != "dispatch")
        self.steps.append(f"tick {side} at {self.now} (fail {nth}): {shown} {_memory(store)}")
        self._observe()

    def _observe(self) -> None:
        """Notes the runs the server has, and which have ended."""
        store = self.sides[0]
        for raw in self.admin.zrange(store.keys.runs, 0, -1):
            self.runs.setdefault(raw.decode(), RunFacts())
        for run_id, facts in self.runs.items():
            state = self.admin.hget(store.keys.run(run_id), "state")
            if state is not None:
                facts.open_when_lost = False  # it exists (again): no loss left to tell
                final = state.decode() in FINAL_STATES
                if final and not facts.ended:
                    facts.ended_at = self.now
                facts.ended = facts.ended or final

    # -- workers ---------------------------------------------------------------------------

    @rule(
        count=st.integers(1, 4),
        worker=st.integers(0, 99),
        how=st.lists(st.sampled_from(HANDLER_ENDS), min_size=4, max_size=4),
    )
    def work(self, count: int, worker: int, how: list[str]) -> None:
        """A worker leases up to ``count`` due items of an open run and runs its handler on
        each: it pays through the ledger and commits (``done``), or stops once it paid
        (``sent``: it holds the lease on), or dies once the provider applied the payment,
        before the ledger says so (``killed in call``), or is paused or dies before it pays
        (its leases ended by the takeover; a paused one resumes later)."""
        store = self.sides[0]
        owner = f"w{worker}"
        for run_id in self._open_runs():
            with contextlib.suppress(RedisLeaseError):
                leases = store.claim_next(run_id, owner, limit=count, ttl=ITEM_TTL)
                if leases:
                    break
        else:
            return
        for lease, end in zip(leases, how, strict=False):
            self._handle(Held(lease, owner), end)

    @precondition(lambda self: bool(self.held))
    @rule(index=st.integers(0, 99), end=st.sampled_from(HANDLER_ENDS))
    def holder_goes_on(self, index: int, end: str) -> None:
        """A holder that stopped after it paid goes on: commits, or stops as ``end`` says."""
        self._handle(self.held.pop(index % len(self.held)), end)

    def _handle(self, held: Held, end: str) -> None:
        TALLY[f"handler {end}"] += 1
        if end in ("paused", "dead"):
            if end == "paused":
                self.paused.append(held)
            self._take_over(held)
            return
        if end == "killed in call":
            self._pay(held, die_after_call=True)
            self._take_over(held)
            return
        if not held.sent and not self._pay(held):
            return
        if end == "sent":
            self.held.append(held)  # paid, not committed yet
            return
        with contextlib.suppress(RedisLeaseError):
            self.sides[0].commit(held.lease, {"paid": True})

    def _take_over(self, held: Held) -> None:
        """What the fleet's watch does to a worker taken for dead: ends its leases now."""
        lease = held.lease
        with contextlib.suppress(RedisLeaseError):
            self.sides[0].cut_leases(lease.run_id, lease.shard, held.owner)
        self.steps.append(f"worker {held.owner} taken over ({lease.item_id} of {lease.run_id})")

    @precondition(lambda self: bool(self.paused))
    @rule(index=st.integers(0, 99))
    def paused_worker_resumes(self, index: int) -> None:
        """A paused holder goes on where it stopped: pays (unless it had), then commits."""
        held = self.paused.pop(index % len(self.paused))
        if held.sent or self._pay(held):
            with contextlib.suppress(RedisLeaseError):
                self.sides[0].commit(held.lease, {"paid": True})

    def _pay(self, held: Held, die_after_call: bool = False) -> bool:
        """The handler's effect; False when the lease was lost or the item failed. With
        ``die_after_call`` the next Redis call after the provider's (the ledger's record of
        what it applied) fails, as a worker killed there never makes it."""
        store = self.sides[0]
        lease = held.lease
        lookup = self.provider.lookup if self.effects == "lookup" else None
        calls = self.calls[0]

        def pay(key: str) -> dict[str, Any]:
            paid = self.provider.pay(key)
            if die_after_call:
                calls.fail_at = calls.calls + 1
            return paid

        try:
            apply_effect(
                store,
                lease,
                EFFECT,
                pay,
                lookup=lookup,
                ttl=ITEM_TTL,  # as a handler's lease.effect: checked and renewed right before
            )
        except LeaseLost:
            return False
        except HandlerError as error:  # NeedsReconciliation: the item goes dead
            TALLY[f"handler {type(error).__name__}"] += 1
            with contextlib.suppress(RedisLeaseError):
                store.fail(lease, f"permanent: {error}", permanent=True)
            return False
        except RedisLeaseError:
            return False
        finally:
            calls.fail_at = None
        held.sent = True
        TALLY["effects applied or found"] += 1
        return True

    # -- losses ----------------------------------------------------------------------------

    @rule(kind=st.sampled_from(["run keys", "whole data set", "retention"]), data=st.data())
    def loss(self, kind: str, data: st.DataObject) -> None:
        """Keys go: every key of one run (eviction, an operator), the whole data set (a
        server restarted empty), or the keys of runs that ended, with their retention (and
        their counted ends, trimmed a day later)."""
        TALLY[f"loss of {kind}"] += 1
        store = self.sides[0]
        if kind == "whole data set":
            self._lose(keys_under(self.admin, self.prefix))
        elif kind == "run keys" and self.runs:
            run_id = data.draw(st.sampled_from(sorted(self.runs)))
            self._lose([k for k in keys_under(self.admin, self.prefix) if f"{{{run_id}" in k])
            kind = f"{kind} of {run_id}"
        elif kind == "retention":  # by the model's clock, as the server's would
            for run_id, facts in self.runs.items():
                if facts.ended_at is None or facts.ended_at > self.now - RETENTION:
                    continue
                self._delete([k for k in keys_under(self.admin, self.prefix) if run_id in k])
                if facts.ended_at > self.now - RETENTION - timedelta(days=1):
                    continue
                key = counted_runs_key(store, "nightly")
                for member in self.admin.zrange(key, 0, -1):
                    if member.decode().startswith(f"{run_id}@"):
                        self.admin.zrem(key, member)
        self.steps.append(f"lost: {kind}")

    def _lose(self, keys: list[str]) -> None:
        """Deletes ``keys``, noting each run whose record goes with them: open or not. A run
        named lost whose lost record goes too had its loss handled: nothing remains to tell."""
        store = self.sides[0]
        gone = set(keys)
        for run_id, facts in self.runs.items():
            state = self.admin.hget(store.keys.run(run_id), "state")
            if state is not None and store.keys.run(run_id) in gone:
                facts.open_when_lost = state.decode() in OPEN_STATES
            elif state is None and store.keys.job_lost("nightly") in gone:
                facts.open_when_lost = False
        self._delete(keys)

    def _delete(self, keys: list[str]) -> None:
        if keys:
            self.admin.delete(*keys)

    # -- the promise -----------------------------------------------------------------------

    @invariant()
    def promise(self) -> None:
        store = self.sides[0]
        twice = {key: n for key, n in self.provider.applied.items() if n > 1}
        assert not twice, f"applied more than once: {twice}\n{self._story()}"
        again = {run: f.made_after_end for run, f in self.runs.items() if f.made_after_end}
        assert not again, f"ended or named runs made again: {again}\n{self._story()}"
        for run_id in self.runs:
            info = self.admin.hgetall(store.keys.run(run_id))
            if info.get(b"state") == b"succeeded":
                status = store.status(run_id)
                done = status.counts["done"]
                assert done == status.planned, f"{run_id} succeeded, {done} of {status.planned}"

    def teardown(self) -> None:
        TALLY["examples"] += 1
        TALLY["steps"] += len(self.steps)
        TALLY["provider calls"] += sum(self.provider.applied.values())
        try:
            self._settle()
        finally:
            keys = keys_under(self.admin, self.prefix)
            if keys:
                self.admin.delete(*keys)
            for store in self.sides:
                store.close()
            self.admin.close()

    def _settle(self) -> None:
        """The current leader ticks three more times with no fault; then every run lost while
        open is made again or named lost."""
        if self.leader is None:
            return
        for _ in range(3):
            self.now += timedelta(minutes=1)
            self._tick(self.leader, None, False)
        store = self.sides[0]
        for run_id, facts in self.runs.items():
            if not facts.open_when_lost:
                continue
            exists = bool(self.admin.exists(store.keys.run(run_id)))
            lost = read_lost(store, run_id)
            named = lost is not None and not lost.rerun_at_ms and lost.todo != MADE_AGAIN
            assert exists or named, (
                f"{run_id} lost while open: neither made again nor named\n{self._story()}"
            )

    def _open_runs(self) -> list[str]:
        runs = Runs(self.sides[0])
        return [r for r in sorted(self.runs) if _state(runs, r) in OPEN_STATES]

    def _story(self) -> str:
        return "steps:\n  " + "\n  ".join(self.steps[-40:])


def _state(runs: Runs, run_id: str) -> str:
    try:
        return runs.info(run_id).get("state", "")
    except RedisLeaseError:
        return ""


def _memory(store: LeaseStore) -> str:
    """What the tick side remembers, in short: its runs' dates and states, its last fire."""
    memory = tick_memory.recall(store)
    if memory is None:
        return "[no memory]"
    runs = ",".join(f"{r[-5:]}:{memory.state_of(r)[:2]}" for r in sorted(memory.runs))
    fired = {
        job: (datetime.fromtimestamp(ms / 1000, UTC).strftime("%m-%d"), d)
        for job, (ms, d) in memory.fired.items()
    }
    return f"[seq {memory.seq} runs {runs} fired {fired}]"
