"""The old names of the renamed public API: each still works for one release, warns
with a DeprecationWarning that names the new one (at the caller's line), and does
what the new name does."""

from __future__ import annotations

import importlib

import pytest
import redis

from redis_lease import (
    CommitReply,
    CommitRequest,
    FailReply,
    HandlerResult,
    Item,
    Lease,
    LeaseStore,
    RedisUnavailable,
    Runs,
)

RUN = "names:2026-12-03"

RENAMED_CLASSES = [
    ("redis_lease", "CommitOutcome", CommitReply),
    ("redis_lease", "FailOutcome", FailReply),
    ("redis_lease", "Outcome", HandlerResult),
    ("redis_lease.protocol.values", "CommitOutcome", CommitReply),
    ("redis_lease.protocol.values", "FailOutcome", FailReply),
    ("redis_lease.fleet.worker.settlements", "Outcome", HandlerResult),
    ("redis_lease.worker", "Outcome", HandlerResult),
    ("redis_lease.protocol.replies", "Committed", CommitReply),
    ("redis_lease.protocol.replies", "Failed", FailReply),
]


@pytest.mark.parametrize(("module", "old", "new"), RENAMED_CLASSES)
def test_an_old_class_name_is_the_new_class_with_a_warning(
    module: str, old: str, new: type
) -> None:
    imported = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated.*{new.__name__}") as caught:
        found = getattr(imported, old)
    assert found is new
    assert caught[0].filename == __file__, "the warning points at the caller"


def test_an_old_name_in_an_import_statement_warns() -> None:
    with pytest.warns(DeprecationWarning, match="use redis_lease.HandlerResult"):
        from redis_lease import Outcome
    assert Outcome is HandlerResult


def test_names_never_defined_are_still_attribute_errors() -> None:
    import redis_lease
    import redis_lease.protocol.values

    with pytest.raises(AttributeError, match="has no attribute 'CommitOutcomes'"):
        redis_lease.CommitOutcomes  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'Reply'"):
        redis_lease.protocol.values.Reply  # noqa: B018


def test_the_old_names_are_not_exported_by_star() -> None:
    import redis_lease

    assert {"CommitReply", "FailReply", "HandlerResult"} <= set(redis_lease.__all__)
    assert not {"CommitOutcome", "FailOutcome", "Outcome"} & set(redis_lease.__all__)


def test_commit_outcome_keyword_is_label(store: LeaseStore) -> None:
    store.add(RUN, [Item("a"), Item("b")], shards=2)
    old = store.claim(RUN, "a", "w", ttl=60)
    new = store.claim(RUN, "b", "w", ttl=60)
    with pytest.warns(DeprecationWarning, match=r"commit\(outcome=\.\.\.\).*label=") as caught:
        stored = store.commit(old, {"n": 1}, outcome="released")
    assert caught[0].filename == __file__
    assert isinstance(stored, CommitReply) and stored.result == {"n": 1}
    assert store.commit(new, {"n": 2}, label="released").result == {"n": 2}
    assert store.status(RUN).counters["outcome_released"] == 2, "both counted under the label"


def test_commit_request_outcome_keyword_is_label(store: LeaseStore) -> None:
    lease = Lease.from_token(RUN, "a", 0, 1)
    with pytest.warns(DeprecationWarning, match=r"CommitRequest\(outcome=") as caught:
        old = CommitRequest(lease, {"n": 1}, outcome="renewed")
    assert caught[0].filename == __file__
    assert old.label == "renewed"
    assert old == CommitRequest(lease, {"n": 1}, label="renewed")


def test_commit_request_outcome_is_sent_as_the_label(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")], shards=1)
    lease = store.claim(RUN, "a", "w", ttl=60)
    with pytest.warns(DeprecationWarning):
        request = CommitRequest(lease, {"n": 1}, outcome="paid")
    [answer] = store.commit_many([request])
    assert isinstance(answer, CommitReply)
    assert store.status(RUN).counters["outcome_paid"] == 1


def test_run_status_events_is_counters(store: LeaseStore) -> None:
    store.add(RUN, [Item("a")], shards=1)
    store.commit(store.claim(RUN, "a", "w", ttl=60), label="ok")
    status = store.status(RUN)
    with pytest.warns(DeprecationWarning, match=r"RunStatus\.events.*RunStatus\.counters") as w:
        events = status.events
    assert w[0].filename == __file__
    assert events == status.counters and events["commits"] == 1
    assert status.to_dict()["events"] == status.counters, "the JSON key is unchanged"


def test_runs_event_and_events_are_the_decision_log(store: LeaseStore) -> None:
    runs = Runs(store)
    with pytest.warns(DeprecationWarning, match=r"Runs\.event\(\).*record_decision") as caught:
        old = runs.event(RUN, "create", "by the old name", by="test")
    assert caught[0].filename == __file__
    new = runs.record_decision(RUN, "create", "by the new name")
    assert (old.kind, old.run_id, old.reason) == ("create", RUN, "by the old name")
    with pytest.warns(DeprecationWarning, match=r"Runs\.events\(\).*Runs\.decisions\(\)"):
        logged = runs.events(RUN)
    assert logged == runs.decisions(RUN)
    assert [(e["kind"], e["reason"]) for e in logged] == [
        ("create", old.reason),
        ("create", new.reason),
    ]
    assert logged[0]["by"] == "test"


def test_store_errors_translates_like_translating_errors(store: LeaseStore) -> None:
    with pytest.raises(RedisUnavailable) as new, store.translating_errors(RUN):
        raise redis.ConnectionError("connection refused")
    renamed = r"errors\(\).*translating_errors\(\)"
    with (
        pytest.warns(DeprecationWarning, match=renamed) as caught,
        pytest.raises(RedisUnavailable) as old,
        store.errors(RUN),
    ):
        raise redis.ConnectionError("connection refused")
    assert caught[0].filename == __file__
    assert str(old.value) == str(new.value)
    with pytest.warns(DeprecationWarning), store.errors(RUN):
        pass  # nothing raised: nothing translated


def test_lease_ref_is_from_token() -> None:
    with pytest.warns(DeprecationWarning, match=r"Lease\.ref\(\).*Lease\.from_token\(\)") as w:
        old = Lease.ref(RUN, "a", 3, 7, "lease-1")
    assert w[0].filename == __file__
    new = Lease.from_token(RUN, "a", 3, 7, "lease-1")
    assert old == new
    assert (new.expires_at_ms, new.payload, new.trace_id) == (0, None, ""), "only the token"


def test_the_old_shard_snapshot_is_the_one_snapshot_with_its_old_field_names() -> None:
    """run_status's ShardSnapshot became replies.Snapshot (the shard_status script's reply
    type too); its name and its field names still answer, each with a warning."""
    from redis_lease.protocol.replies import Snapshot
    from redis_lease.protocol.store import run_status

    with pytest.warns(DeprecationWarning, match="ShardSnapshot is deprecated.*Snapshot"):
        assert run_status.ShardSnapshot is Snapshot
    snap = Snapshot({"done": 1}, 5, 6, 9, {}, 7)
    for old, value in (("first_due", 5), ("first_held", 6), ("first_unknown", 7), ("now", 9)):
        with pytest.warns(DeprecationWarning, match=f"ShardSnapshot.{old} is deprecated") as w:
            assert getattr(snap, old) == value
        assert w[0].filename == __file__, "the warning points at the caller"
