"""A stateful model test: hypothesis drives a LeaseStore and a small in-memory model.

Rules add items, claim (named or next), renew, commit (current, stale, forged or
token-only leases), fail (retry or permanent), release, reap, requeue, close and
reopen. Leases are long (60 s: they never expire here) or short (3 ms: the rule
then polls the server clock until the lease has expired), so the model always
knows whether a lease is live. A run's retry backoff is either far ahead (a
retried item is not due) or zero (due at once). After every step the item
records, the counters and the event counts must equal the model's, and no token
may go down.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import fakeredis
import hypothesis.strategies as st
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)

from redis_lease import LeaseStore
from redis_lease.errors import LeaseLost, NotClaimable, NotFound, RunClosed
from redis_lease.protocol.leases import COUNT_STATES, Item, Lease

RUN = "model:2026-01-01"
SHARDS = 2
POOL = [f"item-{n}" for n in range(6)]
MAX_ATTEMPTS = 3
LONG = 60.0
SHORT = 0.003
WORKER = "model"
#: a quarter of the claims and renewals take a short lease
SHORTS = st.sampled_from([False, False, False, True])

StoreFactory = Callable[[], tuple[LeaseStore, Callable[[], None]]]

SETTINGS = settings(
    max_examples=70,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
#: the embedded backend runs scripts about twice as slowly
FAKE_SETTINGS = settings(SETTINGS, max_examples=40)


@dataclass
class Model:
    """What the store should hold for one item."""

    state: str = "pending"
    token: int = 0
    attempts: int = 0
    #: pending: eligible now (False: its backoff ends far in the future)
    due: bool = True
    #: leased or done: the lease id of the current (or committing) lease
    lease_id: str = ""
    #: leased: the lease has not expired
    live: bool = False
    result: Any = None


def server_ms(store: LeaseStore) -> int:
    """The server clock in milliseconds, as the scripts read it."""
    seconds, micros = store.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def wait_expired(store: LeaseStore, expires_at_ms: int) -> None:
    """Polls the server clock until a lease expiring at ``expires_at_ms`` has expired."""
    deadline = time.monotonic() + 5
    while server_ms(store) < expires_at_ms:
        assert time.monotonic() < deadline, "the server clock did not pass the lease expiry"
        time.sleep(0.001)


class LeaseModel(RuleBasedStateMachine):
    """The store against the model; see the module docstring."""

    leases = Bundle("leases")
    #: where each example's store comes from (set by :func:`machine`)
    make_store: StoreFactory

    def __init__(self) -> None:
        super().__init__()
        self.store, self.cleanup = self.make_store()
        self.items: dict[str, Model] = {}
        self.slow_backoff = True
        self.seen: dict[str, int] = {}
        self.claims = self.commits = self.refused = 0

    # -- helpers --------------------------------------------------------------

    def add_options(self) -> dict[str, Any]:
        base = 3600.0 if self.slow_backoff else 0.001
        return {"max_attempts": MAX_ATTEMPTS, "backoff_base": base, "backoff_cap": base * 2}

    def outcome(self, model: Model) -> str:
        """What a claim of this item does: grant, die (expired last attempt) or a refusal state."""
        if model.state == "pending" and model.due:
            return "grant"
        if model.state == "leased" and not model.live:
            return "grant" if model.attempts < MAX_ATTEMPTS else "die"
        return model.state

    def holds(self, lease: Lease) -> bool:
        """Whether the model says ``lease`` is the item's current, live lease."""
        model = self.items[lease.item_id]
        return (
            model.state == "leased"
            and model.live
            and model.token == lease.token
            and (lease.lease_id == "" or lease.lease_id == model.lease_id)
        )

    def granted(self, lease: Lease, short: bool) -> None:
        """Checks a new lease against the model, then records it."""
        model = self.items[lease.item_id]
        assert self.outcome(model) == "grant"
        assert lease.token == model.token + 1
        assert lease.attempt == model.attempts + 1
        assert lease.takeover == (model.state == "leased")
        model.state, model.token, model.attempts = "leased", lease.token, lease.attempt
        model.lease_id, model.live = lease.lease_id, not short
        self.claims += 1
        event("claim: takeover" if lease.takeover else "claim: granted")

    def lost(self, lease: Lease, error: LeaseLost) -> None:
        assert not self.holds(lease)
        assert error.current_token == self.items[lease.item_id].token
        self.refused += 1
        event("lease lost")

    # -- rules ----------------------------------------------------------------

    @initialize(
        slow=st.booleans(),
        ids=st.lists(st.sampled_from(POOL), min_size=2, max_size=len(POOL), unique=True),
    )
    def create(self, slow: bool, ids: list[str]) -> None:
        self.slow_backoff = slow
        assert self.store.create_run(RUN, shards=SHARDS) == (True, SHARDS)
        self.add(ids)

    @rule(ids=st.lists(st.sampled_from(POOL), min_size=1, max_size=3, unique=True))
    def add(self, ids: list[str]) -> None:
        items = [Item(i, {"id": i}) for i in ids]
        added, existing = self.store.add(RUN, items, **self.add_options())
        assert sorted(added) == sorted(i for i in ids if i not in self.items)
        assert sorted(existing) == sorted(i for i in ids if i in self.items)
        for item_id in added:
            self.items[item_id] = Model()

    @rule(target=leases, item_id=st.sampled_from(POOL), short=SHORTS)
    def claim(self, item_id: str, short: bool) -> Any:
        model = self.items.get(item_id)
        try:
            lease = self.store.claim(RUN, item_id, WORKER, ttl=SHORT if short else LONG)
        except NotFound:
            assert model is None
            return multiple()
        except NotClaimable as error:
            assert model is not None
            expected = self.outcome(model)
            assert expected != "grant"
            if expected == "die":
                model.state, model.live = "dead", False
                assert error.state == "dead"
            else:
                assert error.state == expected
            return multiple()
        assert model is not None
        self.granted(lease, short)
        if short:
            wait_expired(self.store, lease.expires_at_ms)
        return lease

    @rule(target=leases, limit=st.integers(1, 4), short=SHORTS)
    def claim_next(self, limit: int, short: bool) -> Any:
        grantable = {i for i, m in self.items.items() if self.outcome(m) == "grant"}
        dying = {i for i, m in self.items.items() if self.outcome(m) == "die"}
        expired = {i for i in grantable if self.items[i].state == "leased"}
        leases = self.store.claim_next(RUN, WORKER, limit=limit, ttl=SHORT if short else LONG)
        got = {lease.item_id for lease in leases}
        assert len(got) == len(leases) <= limit
        assert got <= grantable
        for lease in leases:
            self.granted(lease, short)
        died = set()
        for item_id in dying:  # an expired last attempt dies if the scan reached it
            record = self.store.item(RUN, item_id)
            assert record.state in ("dead", "leased")
            assert record.token == self.items[item_id].token
            if record.state == "dead":
                died.add(item_id)
                self.items[item_id].state = "dead"
        if not died:
            assert len(leases) == min(limit, len(grantable))
        # within a shard, expired leases are taken before pending items
        for shard in range(SHARDS):
            if any(lease.shard == shard and not lease.takeover for lease in leases):
                missed = [i for i in expired - got if self.store.shard_for(RUN, i) == shard]
                if missed:
                    assert any(self.store.shard_for(RUN, i) == shard for i in died)
        if short and leases:
            wait_expired(self.store, max(lease.expires_at_ms for lease in leases))
            for lease in leases:
                self.items[lease.item_id].live = False
        return multiple(*leases)

    @rule(target=leases, lease=leases, short=SHORTS)
    def renew(self, lease: Lease, short: bool) -> Any:
        try:
            renewed = self.store.renew(lease, ttl=SHORT if short else LONG)
        except LeaseLost as error:
            self.lost(lease, error)
            return multiple()
        assert self.holds(lease)
        assert renewed.token == lease.token and renewed.lease_id == lease.lease_id
        if short:
            wait_expired(self.store, renewed.expires_at_ms)
            self.items[lease.item_id].live = False
        return renewed

    @rule(
        lease=leases,
        lease_id=st.sampled_from(["own", "own", "none", "forged"]),
        shift=st.sampled_from([0, 0, 0, 1, -1]),
    )
    def commit(self, lease: Lease, lease_id: str, shift: int) -> None:
        """Commits with the lease, or with its token shifted, its lease id left out or forged."""
        ids = {"own": lease.lease_id, "none": "", "forged": uuid.uuid4().hex}
        ref = replace(lease, token=max(1, lease.token + shift), lease_id=ids[lease_id])
        model = self.items[ref.item_id]
        repeat = (
            model.state == "done"
            and model.token == ref.token
            and (ref.lease_id == "" or ref.lease_id == model.lease_id)
        )
        current = self.holds(ref)
        result = {"token": ref.token, "lease": lease.lease_id}
        try:
            outcome = self.store.commit(ref, result=result)
        except LeaseLost as error:
            assert not repeat
            self.lost(ref, error)
            return
        assert repeat or current
        assert outcome.token == ref.token
        assert outcome.repeated == repeat
        event("commit: repeated" if repeat else "commit: committed")
        if repeat:
            assert outcome.result == model.result
        else:
            assert outcome.result == result
            model.state, model.live, model.result = "done", False, result
            self.commits += 1

    @rule(lease=leases, permanent=st.booleans())
    def fail(self, lease: Lease, permanent: bool) -> None:
        model = self.items[lease.item_id]
        try:
            outcome = self.store.fail(lease, "boom", permanent=permanent)
        except LeaseLost as error:
            self.lost(lease, error)
            return
        assert self.holds(lease)
        assert outcome.attempts == model.attempts
        model.live = False
        if permanent or model.attempts >= MAX_ATTEMPTS:
            assert outcome.state == "dead"
            model.state = "dead"
        else:
            assert outcome.state == "retry"
            model.state, model.due = "pending", not self.slow_backoff
            if self.slow_backoff:
                assert outcome.eligible_at_ms > server_ms(self.store) + 60_000

    @rule(lease=leases)
    def release(self, lease: Lease) -> None:
        model = self.items[lease.item_id]
        try:
            self.store.release(lease)
        except LeaseLost as error:
            self.lost(lease, error)
            return
        assert self.holds(lease)
        model.state, model.due, model.live = "pending", True, False
        model.attempts = max(0, model.attempts - 1)

    @rule()
    def reap(self) -> None:
        expired = [m for m in self.items.values() if m.state == "leased" and not m.live]
        to_pending, to_dead = self.store.reap(RUN)
        assert to_dead == sum(m.attempts >= MAX_ATTEMPTS for m in expired)
        assert to_pending == len(expired) - to_dead
        for model in expired:
            model.state = "dead" if model.attempts >= MAX_ATTEMPTS else "pending"
            model.due = True

    @rule(named=st.lists(st.sampled_from(POOL), max_size=2, unique=True))
    def requeue(self, named: list[str]) -> None:
        chosen = named or list(self.items)
        dead = [i for i in chosen if i in self.items and self.items[i].state == "dead"]
        assert self.store.requeue(RUN, named) == len(dead)
        for item_id in dead:
            model = self.items[item_id]
            model.state, model.due, model.attempts = "pending", True, 0

    @rule(item_id=st.sampled_from(POOL))
    def closed_window(self, item_id: str) -> None:
        """A closed run refuses claims and new items and changes nothing; reopened, it works."""
        self.store.set_closed(RUN, True)
        with pytest.raises(RunClosed):
            self.store.claim(RUN, item_id, WORKER, ttl=LONG)
        with pytest.raises(RunClosed):
            self.store.claim_next(RUN, WORKER, limit=len(POOL), ttl=LONG)
        with pytest.raises(RunClosed):
            self.store.add(RUN, [Item(item_id)], **self.add_options())
        self.matches_model()
        self.store.set_closed(RUN, False)

    # -- invariants -------------------------------------------------------------

    @invariant()
    def matches_model(self) -> None:
        records = {r.item_id: r for s in range(SHARDS) for r in self.store.items(RUN, s)}
        assert set(records) == set(self.items)
        for item_id, model in self.items.items():
            record = records[item_id]
            assert record.token >= self.seen.get(item_id, 0), f"{item_id}: token went down"
            self.seen[item_id] = record.token
            assert (record.state, record.token, record.attempts) == (
                model.state,
                model.token,
                model.attempts,
            ), item_id
            if model.state in ("leased", "done"):
                assert record.lease_id == model.lease_id
            if model.state == "done":
                assert record.result == model.result
        status = self.store.status(RUN)
        states = Counter(m.state for m in self.items.values())
        assert status.counts == {state: states.get(state, 0) for state in COUNT_STATES}
        assert status.counters.get("claims", 0) == self.claims
        assert status.counters.get("commits", 0) == self.commits
        assert status.counters.get("stale_refused", 0) == self.refused

    def teardown(self) -> None:
        self.cleanup()


def real_factory(url: str) -> StoreFactory:
    """Stores on the real Redis, each under a fresh prefix deleted at teardown."""

    def make() -> tuple[LeaseStore, Callable[[], None]]:
        prefix = f"rltest-model-{uuid.uuid4().hex[:12]}"
        store = LeaseStore.from_url(url, prefix=prefix)

        def cleanup() -> None:
            keys = list(store.client.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                store.client.delete(*keys)
            store.client.close()

        return store, cleanup

    return make


def fake_factory() -> tuple[LeaseStore, Callable[[], None]]:
    """A store on a fresh embedded server per example."""
    client = fakeredis.FakeRedis(server=fakeredis.FakeServer())
    return LeaseStore(client, prefix="rltest-model", url="fakeredis://model"), client.close


def machine(make_store: StoreFactory) -> type[LeaseModel]:
    """The model machine on stores from ``make_store``."""
    return type("LeaseModelOn", (LeaseModel,), {"make_store": staticmethod(make_store)})


def test_model_real_redis(redis_url: str) -> None:
    run_state_machine_as_test(machine(real_factory(redis_url)), settings=SETTINGS)


def test_model_fakeredis() -> None:
    run_state_machine_as_test(machine(fake_factory), settings=FAKE_SETTINGS)
