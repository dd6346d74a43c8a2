"""The history checker catches each kind of violation, and only that kind.

Each test starts from a clean history of three items (claimed, effect applied,
committed with its mark) that passes, plants exactly one violation of one kind
and asserts that the checker reports that kind and no other, with the slice of
history that shows it. The ``info`` tests check that an unknown outcome is read
both ways, and the loss tests that a forgotten window excuses exactly what the
server could have forgotten and nothing before it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from redis_lease import LeaseStore
from redis_lease.fleet.effects.ledger import idempotency_key
from tests.faults import recorder
from tests.faults.checker import KINDS, Summary, Violation, check
from tests.faults.evidence import Evidence, Record, collect, marks_key

RUN = "night:2026-12-01"
ITEMS = ["a", "b", "c"]
EFFECT = "payout"


@dataclass
class History:
    """A hand-written history: JSON lines as the recorder writes them, plus the final state."""

    lines: list[dict[str, Any]] = field(default_factory=list)
    records: dict[str, Record] = field(default_factory=dict)
    marks: dict[str, set[int]] = field(default_factory=dict)
    applied: dict[str, int] = field(default_factory=dict)
    run_state: str = "succeeded"
    deadline_ms: int = 1_000_000
    ops: int = 0

    def op(self, process: str, f: str, end: str, *, wall: int = 0, **fields: Any) -> None:
        """One operation: its invoke line and (unless ``end`` is '') its end line."""
        self.ops += 1
        invoke = {"process": process, "op": self.ops, "type": "invoke", "f": f, "run": RUN}
        invoke.update({k: v for k, v in fields.items() if k in ("item", "token", "lease", "key")})
        self.lines.append({**invoke, "shard": 0, "wall_ms": wall})
        if end:
            result = {k: v for k, v in fields.items() if k not in ("item", "lease", "key")}
            self.lines.append({"process": process, "op": self.ops, "type": end, **result})

    def claim(self, process: str, item: str, token: int, at: int, end: str = "ok") -> None:
        """A claim of ``item`` granted ``token`` at server time ``at``."""
        grant: dict[str, Any] = {"item": item, "token": token, "lease": f"L{item}{token}"}
        grant |= {"server_ms": at, "expires_ms": at + 1000, "attempt": token, "takeover": token > 1}
        fields: dict[str, Any] = {"grants": [grant], "server_ms": at} if end == "ok" else {}
        self.op(process, "claim", end, item=item, lease=f"L{item}{token}", **fields)

    def commit(self, process: str, item: str, token: int, at: int, end: str = "ok") -> None:
        """A commit of ``item`` by ``token``; ``ok`` means accepted at server time ``at``."""
        fields: dict[str, Any] = {"token": token}
        if end == "ok":
            fields |= {"server_ms": at, "repeated": False}
        elif end == "fail":
            fields["error"] = f"LEASE_LOST item={item} token={token} reason=taken_over"
        self.op(process, "commit", end, item=item, lease=f"L{item}{token}", **fields)

    def effect(self, process: str, item: str, token: int, at: int) -> None:
        """The effect recorded as applied by ``token`` at ``at``."""
        key = idempotency_key(RUN, item, EFFECT)
        record = json.dumps({"state": "applied", "token": token, "updated_at": at})
        self.op(process, "record_effect", "ok", item=item, token=token, key=key, record=record)

    def settle(self, process: str, item: str, token: int, at: int) -> None:
        """``item`` claimed at ``at``, its effect applied 10 ms and its commit 20 ms later."""
        self.claim(process, item, token, at)
        self.effect(process, item, token, at + 10)
        self.commit(process, item, token, at + 20)
        self.done(item, token, at + 20)

    def done(self, item: str, token: int, at: int) -> None:
        """The final state of an item committed by ``token`` at ``at``."""
        self.records[item] = Record("done", token, at)
        self.marks.setdefault(item, set()).add(token)
        key = idempotency_key(RUN, item, EFFECT)
        self.applied[key] = self.applied.get(key, 0) + 1

    def last(self, f: str, item: str) -> int:
        """The number of the last ``f`` operation on ``item``."""
        return max(
            int(line["op"])
            for line in self.lines
            if line["type"] == "invoke" and line["f"] == f and line.get("item") == item
        )

    def lose_reply(self, f: str, item: str) -> None:
        """Drops the end line of the last ``f`` operation on ``item`` (its process died)."""
        op = self.last(f, item)
        self.lines = [line for line in self.lines if line["op"] != op or line["type"] == "invoke"]

    def edit(self, f: str, item: str, **fields: Any) -> None:
        """Changes fields of the last ``f`` operation on ``item`` (invoke and end lines)."""
        op = self.last(f, item)
        self.lines = [{**line, **fields} if line["op"] == op else line for line in self.lines]

    def evidence(self) -> Evidence:
        """The evidence the checker reads."""
        return Evidence(
            run_id=RUN,
            planned=list(ITEMS),
            ops=recorder.read_ops(self.lines),
            records=dict(self.records),
            run_state=self.run_state,
            deadline_ms=self.deadline_ms,
            marks={k: set(v) for k, v in self.marks.items()},
            applied=dict(self.applied),
            effects=(EFFECT,),
        )


def clean() -> History:
    """Three items, each claimed once, its effect applied, committed and marked."""
    history = History()
    for n, item in enumerate(ITEMS):
        history.settle("w1", item, 1, 100 * (n + 1))
    return history


def caught(history: History, **options: Any) -> Violation:
    """The violation the checker raises (the test fails when it raises none)."""
    with pytest.raises(Violation) as raised:
        check(history.evidence(), **options)
    return raised.value


def test_the_clean_history_passes_and_is_counted() -> None:
    summary = check(clean().evidence())
    assert (summary.grants, summary.accepted_commits, summary.done) == (3, 3, 3)
    assert summary.effects_applied == 3


def test_a_token_granted_twice_is_caught() -> None:
    history = clean()
    history.claim("w2", "a", 1, 150)  # token 1 of a again, from another process
    violation = caught(history)
    assert violation.kinds == {"duplicate-grant"}
    assert "w2" in str(violation) and "w1" in str(violation)  # the slice names both grants


def test_tokens_that_go_back_are_caught() -> None:
    history = clean()
    history.claim("w2", "b", 3, 120)
    history.claim("w3", "b", 2, 130)  # granted later with a lower token
    history.records["b"] = Record("done", 3, 140)
    history.commit("w2", "b", 3, 140)
    history.marks["b"] = {3}
    violation = caught(history)
    assert "token-order" in violation.kinds
    assert "tokens went back" in str(violation)


def test_two_accepted_commits_of_one_item_are_caught() -> None:
    history = clean()
    history.claim("w2", "c", 2, 400)
    history.commit("w2", "c", 2, 410)  # c was done by token 1 already
    violation = caught(history)
    assert "double-commit" in violation.kinds


def test_a_stale_commit_accepted_after_a_newer_grant_is_caught() -> None:
    history = History()
    for item in ("b", "c"):
        history.settle("w1", item, 1, 50)
    history.claim("w1", "a", 1, 100)
    history.claim("w2", "a", 2, 300)  # the takeover
    history.effect("w1", "a", 1, 310)
    history.commit("w1", "a", 1, 320)  # accepted from the old token: the fence failed
    history.done("a", 1, 320)
    violation = caught(history)
    assert violation.kinds == {"stale-write"}
    assert "token 2" in str(violation)


def test_a_guarded_write_left_by_a_refused_commit_is_caught() -> None:
    history = clean()
    history.commit("w9", "a", 7, 0, end="fail")
    history.marks["a"].add(7)  # a mark from token 7, whose commit was refused
    violation = caught(history)
    assert violation.kinds == {"stale-write"}
    assert "guarded write of token 7" in str(violation)


def test_a_commit_accepted_after_its_lease_expired_is_caught() -> None:
    history = clean()
    history.edit("commit", "b", server_ms=1300)  # b's lease, granted at 200, ends at 1200
    history.records["b"] = Record("done", 1, 1300)
    violation = caught(history)
    assert violation.kinds == {"expired-write"}
    assert "expired at 1200" in str(violation)


def test_a_renewal_extends_the_lease_a_commit_may_use() -> None:
    history = clean()
    history.op("w1", "renew", "ok", item="b", token=1, lease="Lb1", server_ms=1100,
               expires_ms=2500)  # fmt: skip
    history.edit("commit", "b", server_ms=1300)
    history.records["b"] = Record("done", 1, 1300)
    assert check(history.evidence()).accepted_commits == 3


def test_a_commit_from_a_token_never_granted_is_caught() -> None:
    history = clean()
    history.records["c"] = Record("done", 4, 330)
    history.marks["c"] = {4}
    history.edit("commit", "c", token=4)
    violation = caught(history)
    assert violation.kinds == {"stale-write"}
    assert "never granted" in str(violation)


def test_an_accepted_commit_without_its_mark_is_caught() -> None:
    history = clean()
    history.marks["b"] = set()
    assert caught(history).kinds == {"stale-write"}


def test_an_item_left_pending_in_a_finished_run_is_caught() -> None:
    history = clean()
    history.records["c"] = Record("pending", 1)
    history.run_state = "partial"
    violation = caught(history)
    assert violation.kinds == {"unfinished"}


def test_an_unfinished_run_is_caught() -> None:
    history = clean()
    history.run_state = "running"
    assert caught(history).kinds == {"unfinished"}


def test_a_vanished_item_is_caught() -> None:
    history = clean()
    del history.records["b"]
    history.run_state = "partial"
    assert caught(history).kinds == {"vanished"}


def test_an_effect_applied_twice_is_caught() -> None:
    history = clean()
    history.applied[idempotency_key(RUN, "a", EFFECT)] = 2
    violation = caught(history)
    assert violation.kinds == {"duplicate-effect"}
    assert "record_effect" in str(violation)  # the slice shows the ledger's operations


def test_a_done_item_whose_effect_was_never_applied_is_caught() -> None:
    history = clean()
    del history.applied[idempotency_key(RUN, "c", EFFECT)]
    assert caught(history).kinds == {"missing-effect"}


def test_success_with_an_item_done_after_the_deadline_is_caught() -> None:
    history = clean()
    history.deadline_ms = 250  # c was committed at 320
    violation = caught(history)
    assert violation.kinds == {"dishonest-success"}
    assert "'c'" in str(violation)


def test_success_with_a_dead_item_is_caught() -> None:
    history = clean()
    history.records["a"] = Record("dead", 1)
    del history.applied[idempotency_key(RUN, "a", EFFECT)]
    assert caught(history).kinds == {"dishonest-success"}


def test_the_same_dead_item_in_a_partial_run_passes() -> None:
    history = clean()
    history.records["a"] = Record("dead", 1)
    del history.applied[idempotency_key(RUN, "a", EFFECT)]
    history.run_state = "partial"
    assert check(history.evidence()).dead == 1


# -- unknown outcomes ------------------------------------------------------------------


def test_a_commit_without_reply_that_landed_counts_as_the_accepted_one() -> None:
    history = clean()
    history.lose_reply("commit", "c")
    summary = check(history.evidence())
    assert summary.unknown_outcomes == 1
    history.claim("w2", "c", 2, 500)  # yet a later grant shows the landed commit was not final
    assert caught(history).kinds == {"stale-write"}


def test_a_commit_without_reply_that_did_not_land_is_not_counted() -> None:
    history = clean()
    history.commit("w2", "b", 5, 0, end="info")  # never landed: b is done by token 1
    assert check(history.evidence()).unknown_outcomes == 1


def test_a_claim_without_reply_leaves_only_a_gap() -> None:
    history = History()
    for item in ("b", "c"):
        history.settle("w1", item, 1, 50)
    history.claim("w1", "a", 1, 100)
    history.claim("w2", "a", 2, 1200)
    history.lose_reply("claim", "a")  # token 2's grant never reached w2
    history.claim("w3", "a", 3, 2300)
    history.effect("w3", "a", 3, 2310)
    history.commit("w3", "a", 3, 2320)
    history.done("a", 3, 2320)
    history.deadline_ms = 10_000
    summary = check(history.evidence())
    assert (summary.unknown_outcomes, summary.grants) == (1, 4)


# -- forgotten writes ------------------------------------------------------------------


def crashed() -> History:
    """a's token 2, granted at 500, is forgotten in a crash and granted again at 900."""
    history = History()
    for item in ("b", "c"):
        history.settle("w1", item, 1, 50)
    history.claim("w1", "a", 1, 100)
    history.claim("w2", "a", 2, 500)
    history.claim("w3", "a", 2, 900)
    history.effect("w3", "a", 2, 910)
    history.commit("w3", "a", 2, 920)
    history.done("a", 2, 920)
    return history


def test_a_token_granted_again_is_allowed_only_when_the_server_forgot_it() -> None:
    assert caught(crashed()).kinds == {"duplicate-grant"}
    summary = check(crashed().evidence(), loss=(450, 800))
    assert summary.regranted_after_loss == 1
    # a window that starts after the grant: that grant was durable, so it is a duplicate
    assert caught(crashed(), loss=(550, 800)).kinds == {"duplicate-grant"}
    # token 1 was granted before the window: granting it again is never excused
    history = crashed()
    history.claim("w4", "a", 1, 950)
    assert caught(history, loss=(450, 800)).kinds == {"duplicate-grant"}


def test_a_redone_item_is_allowed_only_when_its_first_commit_was_forgotten() -> None:
    history = crashed()
    history.commit("w2", "a", 2, 520)  # accepted, then forgotten in the crash
    summary = check(history.evidence(), loss=(450, 800))
    assert summary.regranted_after_loss == 1
    history = crashed()
    history.commit("w1", "a", 1, 400)  # accepted before the window: a real double commit
    assert "double-commit" in caught(history, loss=(450, 800)).kinds


def test_a_lost_item_never_lets_the_run_succeed() -> None:
    history = clean()
    del history.records["c"]
    violation = caught(history, may_lose=True)
    assert violation.kinds == {"dishonest-success"}
    history.run_state = "partial"
    assert isinstance(check(history.evidence(), may_lose=True), Summary)


# -- a recorded history, end to end ----------------------------------------------------


def test_a_recorded_history_of_a_real_run_passes_and_a_forged_mark_fails(
    real_store: LeaseStore, tmp_path: Path
) -> None:
    from redis_lease import Item
    from redis_lease.fleet.runs.lifecycle import Runs
    from redis_lease.protocol.guards import Write

    run = "checked:2026-12-01"
    real_store.add(run, [Item(f"i{n}", {"n": n}) for n in range(6)], shards=2)
    uninstall = recorder.install(tmp_path, "t")
    try:
        for _ in range(6):
            lease = real_store.claim_any(run, "w", ttl=30)
            mark = Write.sadd(
                marks_key(real_store.prefix, run, lease.shard), [f"{lease.item_id}|{lease.token}"]
            )
            real_store.commit(lease, result={"ok": True}, writes=[mark])
    finally:
        uninstall()
    planned = [f"i{n}" for n in range(6)]
    evidence = collect(real_store, run, planned, history_dir=tmp_path, applied={})
    assert evidence.run_state == "running"
    with pytest.raises(Violation, match="the run is running, not final"):
        check(evidence)
    Runs(real_store).finalize(run, "every item is done")
    evidence = collect(real_store, run, planned, history_dir=tmp_path, applied={})
    summary = check(evidence)
    assert (summary.grants, summary.accepted_commits) == (6, 6)
    real_store.client.sadd(marks_key(real_store.prefix, run, 0), "i0|9")
    real_store.client.sadd(marks_key(real_store.prefix, run, 1), "i0|9")
    forged = collect(real_store, run, planned, history_dir=tmp_path, applied={})
    with pytest.raises(Violation) as raised:
        check(forged)
    assert raised.value.kinds == {"stale-write"}


def test_a_renewal_accepted_after_its_lease_expired_is_caught() -> None:
    history = clean()
    history.op("w1", "renew", "ok", item="b", token=1, lease="Lb1", server_ms=1500,
               expires_ms=2500)  # fmt: skip
    violation = caught(history)
    assert violation.kinds == {"expired-write"}
    assert "renew of token 1" in str(violation)


def test_a_forgotten_commit_redone_under_a_lower_token_is_allowed_in_its_window() -> None:
    history = crashed()  # a: token 2 forgotten at 500, granted again at 900, done by it
    history.claim("w2", "a", 3, 510)
    history.commit("w2", "a", 3, 520)  # accepted, then forgotten with the window
    summary = check(history.evidence(), loss=(450, 800))
    assert summary.recommitted_after_loss == 1
    assert "double-commit" in caught(history).kinds  # without the window it is caught


#: The test that plants each kind of violation.
PLANTED = {
    "duplicate-grant": test_a_token_granted_twice_is_caught,
    "token-order": test_tokens_that_go_back_are_caught,
    "double-commit": test_two_accepted_commits_of_one_item_are_caught,
    "stale-write": test_a_stale_commit_accepted_after_a_newer_grant_is_caught,
    "expired-write": test_a_commit_accepted_after_its_lease_expired_is_caught,
    "unfinished": test_an_item_left_pending_in_a_finished_run_is_caught,
    "vanished": test_a_vanished_item_is_caught,
    "duplicate-effect": test_an_effect_applied_twice_is_caught,
    "missing-effect": test_a_done_item_whose_effect_was_never_applied_is_caught,
    "dishonest-success": test_success_with_an_item_done_after_the_deadline_is_caught,
}


def test_every_kind_of_violation_is_planted_once() -> None:
    assert sorted(PLANTED) == sorted(KINDS)
