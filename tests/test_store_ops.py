"""LeaseStore operations on both backends: adding, sharding, claiming, status, maintenance."""

from __future__ import annotations

import zlib

import pytest

from redis_lease import InvalidInput, Item, LeaseStore, NotClaimable, NotFound, RunClosed
from redis_lease.protocol.keys import shard_of
from tests.helpers import records, server_ms, snapshot, wait_past

RUN = "ops:2026-12-02"
SHORT = 0.5  # seconds: a lease meant to expire during the test, not before its first check


def items(*ids: str) -> list[Item]:
    return [Item(i, {"id": i}) for i in ids]


# -- add ----------------------------------------------------------------------------


def test_add_is_idempotent(store: LeaseStore) -> None:
    added, existing = store.add(RUN, items("a", "b", "c"), shards=2)
    assert (sorted(added), existing) == (["a", "b", "c"], [])
    before = snapshot(store.client, store.prefix)
    added, existing = store.add(RUN, [Item("b", {"changed": True}), Item("a")], shards=2)
    assert (added, sorted(existing)) == ([], ["a", "b"])
    assert snapshot(store.client, store.prefix) == before
    assert store.item(RUN, "b").payload == {"id": "b"}
    assert store.status(RUN).counts["pending"] == 3


def test_add_mixes_new_and_existing_and_repeated_ids(store: LeaseStore) -> None:
    store.add(RUN, items("a"))
    added, existing = store.add(RUN, [Item("a"), Item("n", 1), Item("n", 2)])
    assert (added, existing) == (["n"], ["a"])
    assert store.item(RUN, "n").payload == 2, "the last payload given for an id wins"
    assert store.status(RUN).total == 2


def test_add_creates_the_run_once(store: LeaseStore) -> None:
    store.add(RUN, items("a"), shards=3)
    store.add(RUN, items("b"))  # shards omitted: the run's count is used
    assert store.create_run(RUN) == (False, 3)
    assert store.shard_count(RUN) == 3
    assert store.run_ids() == [RUN]
    fresh = LeaseStore(store.client, prefix=store.prefix)
    assert fresh.shard_count(RUN) == 3 and fresh.item(RUN, "b").state == "pending"


def test_unknown_run_and_item_are_not_found(store: LeaseStore) -> None:
    with pytest.raises(NotFound):
        store.claim("nope", "a", "w")
    store.add(RUN, items("a"))
    with pytest.raises(NotFound) as info:
        store.claim(RUN, "zz", "w")
    assert (info.value.run_id, info.value.item_id) == (RUN, "zz")
    with pytest.raises(NotFound):
        store.item(RUN, "zz")


# -- shards -------------------------------------------------------------------------


def test_shard_of_is_crc32_of_the_id() -> None:
    # pinned: stored items depend on the hash, so it must never change.
    # 0xCBF43926 is the published CRC-32 check value of "123456789".
    assert shard_of("123456789", 1 << 32) == 0xCBF43926
    assert shard_of("123456789", 16) == 6
    assert shard_of("acct_42:cursor_9:2026-12-02", 16) == 2
    assert shard_of("a", 7) == zlib.crc32(b"a") % 7
    assert shard_of("x", 1) == 0


def test_items_live_in_their_stable_shard(store: LeaseStore) -> None:
    ids = [f"acct_{n}:cursor_{n % 5}" for n in range(200)]
    store.add(RUN, items(*ids), shards=8)
    per_shard = {s: set(records(store.client, store.keys.shard(RUN, s)[2])) for s in range(8)}
    for item_id in ids:
        shard = shard_of(item_id, 8)
        assert item_id in per_shard[shard]
        assert store.shard_for(RUN, item_id) == shard
        assert store.item(RUN, item_id).shard == shard
    assert sum(len(v) for v in per_shard.values()) == 200
    assert all(10 <= len(v) <= 45 for v in per_shard.values()), "crc32 spreads ids evenly"
    assert sorted(r.item_id for r in store.items(RUN, 3)) == sorted(per_shard[3])


def test_claim_next_across_shards(store: LeaseStore) -> None:
    ids = [f"i{n}" for n in range(20)]
    store.add(RUN, items(*ids), shards=4)
    leases = store.claim_next(RUN, "w", limit=15, ttl=60)
    assert len(leases) == 15 and len({lease.item_id for lease in leases}) == 15
    assert len({lease.shard for lease in leases}) >= 2
    for lease in leases:
        assert lease.shard == shard_of(lease.item_id, 4)
        assert lease.token == 1 and lease.payload == {"id": lease.item_id}
    rest = store.claim_next(RUN, "w", limit=100, ttl=60)
    assert sorted(lease.item_id for lease in leases + rest) == sorted(ids)
    assert store.claim_next(RUN, "w", limit=5) == []
    with pytest.raises(NotClaimable) as info:
        store.claim_any(RUN, "w")
    # no item is meant: no state (``state`` is only ever an item's) and the message says why
    assert info.value.state is None and info.value.until_ms is None
    assert str(info.value) == f"nothing is due in run {RUN!r}"


def test_claim_next_of_one_shard(store: LeaseStore) -> None:
    ids = [f"i{n}" for n in range(20)]
    store.add(RUN, items(*ids), shards=4)
    in_two = sorted(i for i in ids if shard_of(i, 4) == 2)
    leases = store.claim_next(RUN, "w", shard=2, limit=100)
    assert sorted(lease.item_id for lease in leases) == in_two
    assert {lease.shard for lease in leases} == {2}
    assert len({lease.lease_id for lease in leases}) == len(leases)
    assert store.status(RUN).counts["leased"] == len(in_two)
    with pytest.raises(InvalidInput, match="shard 4 out of range"):
        store.claim_next(RUN, "w", shard=4)


def test_claim_any_takes_one_due_item(store: LeaseStore) -> None:
    store.add(RUN, items("a", "b"), shards=2)
    first = store.claim_any(RUN, "w")
    second = store.claim_any(RUN, "w")
    assert {first.item_id, second.item_id} == {"a", "b"}


# -- status -------------------------------------------------------------------------


def test_status_counts_every_state(store: LeaseStore) -> None:
    store.add(RUN, items("p", "l", "d", "x"), shards=2, max_attempts=3)
    store.claim(RUN, "l", "w")
    store.commit(store.claim(RUN, "d", "w"), "ok")
    store.fail(store.claim(RUN, "x", "w"), "bad", permanent=True)
    status = store.status(RUN)
    assert status.counts == {"pending": 1, "leased": 1, "done": 1, "dead": 1}
    assert (status.total, status.unfinished, status.shards) == (4, 2, 2)
    assert status.counters["claims"] == 3 and status.counters["commits"] == 1
    assert status.counters["failures"] == 1
    assert status.state == "running"
    assert status.to_dict()["counts"] == status.counts


def test_status_ages_come_from_the_oldest_eligible_and_oldest_lease(store: LeaseStore) -> None:
    added_at = server_ms(store.client)
    store.add(RUN, items("old", "new"), shards=2)
    first = store.status(RUN)
    wait_past(store.client, first.now_ms + 30)
    later = store.status(RUN)
    assert later.oldest_eligible_age_seconds > first.oldest_eligible_age_seconds
    assert later.oldest_eligible_age_seconds >= 0.03
    assert later.oldest_eligible_age_seconds <= (later.now_ms - added_at) / 1000
    assert later.oldest_leased_age_seconds == 0

    lease = store.claim(RUN, "old", "w", ttl=60)
    leased_at = lease.expires_at_ms - 60_000
    wait_past(store.client, leased_at + 20)
    status = store.status(RUN)
    assert status.oldest_leased_age_seconds == pytest.approx(
        (status.now_ms - leased_at) / 1000, abs=0.002
    )
    assert status.oldest_leased_age_seconds >= 0.02
    store.renew(lease, ttl=120)
    assert store.status(RUN).oldest_leased_age_seconds >= status.oldest_leased_age_seconds, (
        "renewing does not make a lease younger"
    )

    store.commit(lease, None)
    store.commit(store.claim(RUN, "new", "w"), None)
    done = store.status(RUN)
    assert (done.oldest_eligible_age_seconds, done.oldest_leased_age_seconds) == (0, 0)


def test_a_final_runs_eligible_age_stops_at_its_end(store: LeaseStore) -> None:
    from redis_lease.fleet.runs.lifecycle import Runs

    store.add(RUN, items("a", "b"), shards=2)
    wait_past(store.client, store.status(RUN).now_ms + 20)
    Runs(store).finalize(RUN, "closed by the test")
    ended = store.status(RUN)
    assert ended.state == "failed" and ended.oldest_eligible_age_seconds >= 0.02
    wait_past(store.client, ended.now_ms + 30)
    later = store.status(RUN)
    assert later.oldest_eligible_age_seconds == ended.oldest_eligible_age_seconds
    assert later.counts["pending"] == 2


def test_an_item_waiting_for_its_retry_is_not_eligible_yet(store: LeaseStore) -> None:
    store.add(RUN, items("a"), backoff_base=60)
    store.fail(store.claim(RUN, "a", "w"), "later")
    status = store.status(RUN)
    assert status.counts["pending"] == 1
    assert status.oldest_eligible_age_seconds == 0


# -- fail ---------------------------------------------------------------------------


def test_fail_retries_within_the_backoff_window_then_goes_dead(store: LeaseStore) -> None:
    store.add(RUN, items("a"), max_attempts=2, backoff_base=0.3, backoff_cap=10)
    lease = store.claim(RUN, "a", "w")
    before = server_ms(store.client)
    outcome = store.fail(lease, "provider timeout")
    after = server_ms(store.client)
    assert (outcome.state, outcome.attempts) == ("retry", 1)
    # attempt 1: delay = 300 ms * (0.5 + jitter / 2), jitter in [0, 1)
    assert before + 150 <= outcome.eligible_at_ms < after + 300
    record = store.item(RUN, "a")
    assert (record.state, record.error, record.attempts) == ("pending", "provider timeout", 1)

    with pytest.raises(NotClaimable) as info:
        store.claim(RUN, "a", "w")
    assert (info.value.state, info.value.until_ms) == ("pending", outcome.eligible_at_ms)
    assert store.claim_next(RUN, "w") == []

    wait_past(store.client, outcome.eligible_at_ms)
    lease = store.claim(RUN, "a", "w")
    assert (lease.token, lease.attempt) == (2, 2)
    outcome = store.fail(lease, "provider timeout again")
    assert (outcome.state, outcome.eligible_at_ms, outcome.attempts) == ("dead", 0, 2)
    record = store.item(RUN, "a")
    assert (record.state, record.error) == ("dead", "provider timeout again")
    assert store.status(RUN).counts["dead"] == 1
    with pytest.raises(NotClaimable) as info:
        store.claim(RUN, "a", "w")
    assert info.value.state == "dead"


def test_permanent_fail_goes_dead_on_the_first_attempt(store: LeaseStore) -> None:
    store.add(RUN, items("a"), max_attempts=5)
    outcome = store.fail(store.claim(RUN, "a", "w"), "no such account", permanent=True)
    assert (outcome.state, outcome.attempts) == ("dead", 1)
    assert store.item(RUN, "a").error == "no such account"


def test_long_error_texts_are_cut(store: LeaseStore) -> None:
    store.add(RUN, items("a"))
    store.fail(store.claim(RUN, "a", "w"), "e" * 10_000)
    error = store.item(RUN, "a").error
    assert error is not None and 0 < len(error) <= 4000


# -- reap, requeue, close --------------------------------------------------------------


def test_reap_returns_expired_leases_to_pending(store: LeaseStore) -> None:
    store.add(RUN, items("a", "b", "c"), shards=3, max_attempts=3)
    # 1 s, not SHORT: the first reap must come before they expire, on a loaded machine too
    short = [store.claim(RUN, i, "w", ttl=1) for i in ("a", "b")]
    store.claim(RUN, "c", "w", ttl=60)
    assert store.reap(RUN) == (0, 0)
    wait_past(store.client, max(lease.expires_at_ms for lease in short))
    assert store.reap(RUN) == (2, 0)
    assert store.status(RUN).counts == {"pending": 2, "leased": 1, "done": 0, "dead": 0}
    assert store.status(RUN).counters["expired"] == 2
    again = store.claim(RUN, "a", "w")
    assert (again.token, again.attempt, again.takeover) == (2, 2, False)


def test_reap_sends_a_lease_expired_on_its_last_attempt_dead(store: LeaseStore) -> None:
    store.add(RUN, items("a"), max_attempts=1)
    lease = store.claim(RUN, "a", "w", ttl=SHORT)
    wait_past(store.client, lease.expires_at_ms)
    assert store.reap(RUN) == (0, 1)
    record = store.item(RUN, "a")
    assert record.state == "dead" and record.error == "lease expired on the last attempt"


def test_requeue_brings_dead_items_back_with_fresh_attempts(store: LeaseStore) -> None:
    store.add(RUN, items("a", "b", "c"), shards=2, max_attempts=1)
    for item_id in ("a", "b", "c"):
        store.fail(store.claim(RUN, item_id, "w"), "broken")
    assert store.status(RUN).counts["dead"] == 3
    assert store.requeue(RUN, ["b"]) == 1
    assert store.item(RUN, "b").state == "pending"
    assert store.item(RUN, "a").state == "dead"
    assert store.requeue(RUN, ["b"]) == 0, "only dead items move"
    assert store.requeue(RUN) == 2
    status = store.status(RUN)
    assert status.counts == {"pending": 3, "leased": 0, "done": 0, "dead": 0}
    assert status.counters["requeued"] == 3
    lease = store.claim(RUN, "a", "w")
    assert (lease.attempt, lease.token) == (1, 2)


def test_requeue_limit_is_per_shard(store: LeaseStore) -> None:
    """Four, three and one dead items on three shards: a limit of two requeues 2 + 2 + 1."""
    wanted = {0: 4, 1: 3, 2: 1}
    by_shard: dict[int, list[str]] = {shard: [] for shard in wanted}
    for n in range(200):
        item_id = f"d{n}"
        shard = shard_of(item_id, 3)
        if len(by_shard[shard]) < wanted[shard]:
            by_shard[shard].append(item_id)
    ids = [item_id for shard_ids in by_shard.values() for item_id in shard_ids]
    assert {shard: len(by_shard[shard]) for shard in wanted} == wanted
    store.add(RUN, items(*ids), shards=3, max_attempts=1)
    for item_id in ids:
        store.fail(store.claim(RUN, item_id, "w"), "broken")
    assert [counts["dead"] for counts in store.shard_counts(RUN)] == [4, 3, 1]

    assert store.requeue(RUN, limit=2) == 5
    counts = store.shard_counts(RUN)
    assert [c["dead"] for c in counts] == [2, 1, 0]
    assert [c["pending"] for c in counts] == [2, 2, 1]
    assert [c.get("requeued", 0) for c in counts] == [2, 2, 1]


def test_a_closed_run_refuses_claims_and_new_items_until_reopened(store: LeaseStore) -> None:
    store.add(RUN, items("a", "b"), shards=2)
    held = store.claim(RUN, "b", "w")
    store.set_closed(RUN, True)
    before = snapshot(store.client, store.prefix)
    with pytest.raises(RunClosed) as info:
        store.claim(RUN, "a", "w")
    assert info.value.run_id == RUN and "resume" in info.value.message
    with pytest.raises(RunClosed):
        store.claim_next(RUN, "w", limit=5)
    with pytest.raises(RunClosed):
        store.add(RUN, items("c"))
    assert snapshot(store.client, store.prefix) == before
    assert store.commit(held, "finished").repeated is False, "a holder may still finish"

    store.set_closed(RUN, False)
    assert store.claim(RUN, "a", "w").token == 1
    assert store.add(RUN, items("c")) == (["c"], [])
