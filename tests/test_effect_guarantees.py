"""What a handler is promised about its effects, one test per row of the table in
docs/concepts/effects-and-idempotency.md ("What each provider is promised").

Each test runs on a real Redis with the loopback HTTP provider (in this process), told
to dedupe by key or not. The hard case is a call still on its way when its item is taken
over: the first holder's ``call`` waits before its request reaches the provider (a
worker paused, cut off or killed mid-call), its lease runs out (no keeper renews it
here, as none would in a paused process), a second holder claims the item and applies
the effect, then the first request lands. The rows after a loss of data are in
tests/test_effects_after_loss.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from redis_lease import Item, LeaseLost, LeaseStore, NotClaimable
from redis_lease.demo.provider import ProviderClient, ProviderServer, ProviderState
from redis_lease.fleet.effects.ledger import NeedsReconciliation, idempotency_key
from redis_lease.fleet.jobs.live_lease import ActiveLease
from tests.helpers import server_ms, wait_past

RUN = "payouts:2026-12-02"
ITEM = "acct_7:cursor_1:2026-12-02"
EFFECT = "payout"
KEY = idempotency_key(RUN, ITEM, EFFECT)
#: The first holder's lease, in seconds: long enough that a busy machine does not lose it
#: between steps the test means to be quick, short enough to run out within the test.
TTL = 1.5


@pytest.fixture(params=[True, False], ids=["dedupes", "no-dedupe"])
def provider(request: pytest.FixtureRequest) -> Iterator[ProviderServer]:
    """The loopback provider, deduping by key or not."""
    state = ProviderState(honour_keys=bool(request.param))
    with ProviderServer(state=state).start() as server:
        yield server


def start(store: LeaseStore) -> ActiveLease:
    """The item added and claimed by the first holder (no keeper: nothing renews it)."""
    store.add(RUN, [Item(ITEM, {"account": 7})], shards=1)
    sent_at = time.monotonic()
    return ActiveLease(store, store.claim(RUN, ITEM, "w1", ttl=TTL), TTL, sent_at=sent_at)


class HeldCall:
    """The first holder's effect in a thread of its own, its request held on its way to
    the provider until :meth:`land`."""

    def __init__(self, active: ActiveLease, client: ProviderClient, **declared: Any) -> None:
        self.started, self._go = threading.Event(), threading.Event()
        self.outcome: Any = None

        def call(key: str) -> Any:
            self.started.set()
            assert self._go.wait(30), "the test never let the request land"
            return client.apply(key, {"holder": "first"})

        def run() -> None:
            try:
                self.outcome = active.effect(EFFECT, call, **declared)
            except Exception as error:  # what the first holder saw, for the test to judge
                self.outcome = error

        self._thread = threading.Thread(target=run, name="first-holder")
        self._thread.start()
        assert self.started.wait(10), "the first holder never called"

    def land(self) -> Any:
        """Lets the request reach the provider; returns what the first holder saw."""
        self._go.set()
        self._thread.join(30)
        assert not self._thread.is_alive()
        return self.outcome


def taken_over(store: LeaseStore) -> ActiveLease:
    """The item claimed by a second holder once the first lease ran out (server clock)."""
    expires = store.item(RUN, ITEM).expires_at_ms
    assert expires is not None
    wait_past(store.client, expires, timeout=TTL + 5)
    lease = store.claim(RUN, ITEM, "w2", ttl=30.0)
    assert lease.takeover and lease.token == 2
    return ActiveLease(store, lease, 30.0)


def counts(server: ProviderServer) -> tuple[int, int]:
    """(requests, applications) of the key at the provider."""
    with server.state.lock:
        return server.state.requests.get(KEY, 0), server.state.applications.get(KEY, 0)


def sender(client: ProviderClient) -> Callable[[str], Any]:
    """The second holder's call."""
    return lambda key: client.apply(key, {"holder": "second"})


# -- the check right before the call ----------------------------------------------------


def test_a_call_that_starts_near_the_end_of_its_lease_is_not_taken_over(
    real_store: LeaseStore,
) -> None:
    """The intent is recorded by the script that checks the lease and renews it for its
    TTL, right before the call: an item whose call began with little of its lease left
    cannot be claimed while the call is under way (a call shorter than the TTL). Before,
    the claim took it over and the new holder's lookup, blind to the request on its way,
    paid again at a provider that does not dedupe."""
    store = real_store
    with ProviderServer(state=ProviderState(honour_keys=False)).start() as server:
        client = ProviderClient(server.url)
        active = start(store)
        claimed_until = active.lease.expires_at_ms
        wait_past(store.client, claimed_until - 400)  # less than 0.4 s of the lease left
        first = HeldCall(active, client, lookup=client.lookup)
        renewed_until = store.item(RUN, ITEM).expires_at_ms or 0
        wait_past(store.client, claimed_until)  # the lease it was claimed with ran out
        with pytest.raises(NotClaimable):
            store.claim(RUN, ITEM, "w2", ttl=30.0)
        assert renewed_until >= claimed_until + 1000  # renewed for its TTL, before the call
        assert server_ms(store.client) < renewed_until  # still within the renewed lease
        assert first.land()["key"] == KEY
        assert counts(server) == (1, 1)
        record = store.effect(RUN, ITEM, KEY)
        assert record is not None and (record["state"], record["token"]) == ("applied", 1)


# -- one test per row ---------------------------------------------------------------------


def test_row_keys_honoured_a_call_in_flight_at_a_takeover_is_applied_once(
    real_store: LeaseStore,
) -> None:
    """``honours_keys=True``, a provider that dedupes: the new holder sends the same key
    again, and the late request is a replay. At most once, always."""
    store = real_store
    with ProviderServer(state=ProviderState(honour_keys=True)).start() as server:
        client = ProviderClient(server.url)
        first = HeldCall(start(store), client, honours_keys=True)
        second = taken_over(store)
        paid = second.effect(EFFECT, sender(client), honours_keys=True)
        assert counts(server) == (1, 1)
        assert paid["key"] == KEY
        assert isinstance(first.land(), LeaseLost)  # its outcome is refused: not the holder
        assert counts(server) == (2, 1)  # the late request was a replay


def test_row_lookup_only_a_call_in_flight_at_a_takeover_can_be_applied_twice(
    real_store: LeaseStore, provider: ProviderServer
) -> None:
    """``lookup`` only: the documented exception. The first holder's lease runs out while
    its request is on its way (its worker paused mid-call); the new holder's lookup finds
    nothing and pays; the late request lands: a provider that does not dedupe applies it
    twice, one that does applies it once. Breaks if the window were closed or moved (the
    promise would then be wrong the other way) or if the lookup were skipped."""
    store = real_store
    client = ProviderClient(provider.url)
    first = HeldCall(start(store), client, lookup=client.lookup)
    second = taken_over(store)
    second.effect(EFFECT, sender(client), lookup=client.lookup)
    assert counts(provider) == (1, 1)
    first.land()
    dedupes = provider.state.honour_keys
    assert counts(provider) == (2, 1 if dedupes else 2)


def test_row_neither_a_call_in_flight_at_a_takeover_stops_the_new_holder(
    real_store: LeaseStore, provider: ProviderServer
) -> None:
    """Neither ``lookup`` nor ``honours_keys``: the new holder finds the first holder's
    intent open and stops with NeedsReconciliation, sending nothing; the late request is
    the only one. At most once, whatever the provider."""
    store = real_store
    client = ProviderClient(provider.url)
    first = HeldCall(start(store), client)
    second = taken_over(store)
    with pytest.raises(NeedsReconciliation, match="recorded its intent and never its outcome"):
        second.effect(EFFECT, sender(client))
    assert counts(provider) == (0, 0)
    first.land()
    assert counts(provider) == (1, 1)
