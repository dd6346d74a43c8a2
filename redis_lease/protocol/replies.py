"""Each script's reply, decoded in exactly one place into a named type.

:data:`DECODERS` maps every script to its decoder; :class:`~redis_lease.Scripts`
applies it, so no other module reads a reply by position.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from redis.exceptions import ResponseError

from .leases import CommitReply, FailReply


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pairs(flat: Sequence[Any]) -> dict[str, Any]:
    return {_text(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def _ms(value: Any) -> int | None:
    return int(float(value)) if value not in (None, b"", "") else None


class Grant(NamedTuple):
    """One lease granted by claim or claim_next."""

    item_id: str
    token: int
    lease_id: str
    expires_at_ms: int
    attempt: int
    payload: str
    takeover: bool
    now_ms: int


class Renewed(NamedTuple):
    """renew: the new expiry."""

    expires_at_ms: int
    now_ms: int


class Reaped(NamedTuple):
    """reap: leases moved back to pending and to dead."""

    to_pending: int
    to_dead: int
    now_ms: int


class Cut(NamedTuple):
    """cut_leases: leases ended early, and when (server clock); ``cursor``: where the walk
    over the shard's leases goes on ('' once it is done)."""

    leases: int
    now_ms: int
    cursor: str = ""


class Found(NamedTuple):
    """A registered shard job a sweep found: its RQ id, its entry as stored (b'' when
    none) and a time in server ms (its last beat; or when its takeover began)."""

    rq_id: str
    entry: bytes
    at_ms: int


class Swept(NamedTuple):
    """sweep_shard_jobs: the server's time, the end of the last stall, the jobs dead by
    the rule and the takeovers begun and never finished."""

    now_ms: int
    stall_end_ms: int
    dead: list[Found]
    stuck: list[Found]


def _found(flat: Sequence[Any]) -> list[Found]:
    return [
        Found(_text(flat[i]), _bytes(flat[i + 1]), int(flat[i + 2])) for i in range(0, len(flat), 3)
    ]


def _bytes(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class Snapshot(NamedTuple):
    """One shard's counts at one moment: counters (with pending, leased, dead from the
    indexes) and first entries (a due item's eligible-at, a lease's start, an unknown
    effect's since; ms, None when there is none).

    The shard_status script's reply, with the shard's settings (``meta``); also what a
    run's status reads with plain commands (:mod:`~redis_lease.protocol.store.run_status`,
    for a user who may send no script), with every count state present and ``meta`` empty.
    """

    counts: dict[str, int]
    first_due_ms: int | None
    first_held_ms: int | None
    now_ms: int
    meta: dict[str, str]
    first_unknown_ms: int | None


class RunCreated(NamedTuple):
    """create_run: whether it was created now, its shard count and creation time."""

    created: bool
    shards: int
    created_at_ms: int


class Transition(NamedTuple):
    """run_transition: whether the state changed, the state before (or now), the time."""

    changed: bool
    state: str
    now_ms: int


class LeaderLease(NamedTuple):
    """tick_leader: whether the caller holds the tick leader's lease now; the lease's token,
    holder and expiry (ms, the server's clock; another's, or '' and 0 when none holds it);
    the server's time."""

    held: bool
    token: int
    holder: str
    expires_ms: int
    now_ms: int


class EffectRecorded(NamedTuple):
    """record_effect: the previous state ('' when new), the stored record (JSON text), the
    key it is stored under, and the lease's new expiry (ms) when the call renewed it, else 0."""

    previous: str
    record: str
    key: str = ""
    expires_at_ms: int = 0


class Released(NamedTuple):
    """settle: a release (the server time it happened)."""

    now_ms: int


#: One settle row: the operation's reply, or the refusal as the error the server would
#: have answered had the operation been sent alone.
Settled = CommitReply | FailReply | Released | Renewed | ResponseError


class SlotAnswer(NamedTuple):
    """slot_acquire: granted or not, the cap, slots in use, and how long to wait (ms)."""

    granted: bool
    cap: int
    in_use: int
    wait_ms: int


class SlotReleased(NamedTuple):
    """slot_release: the cap after the release and whether it changed."""

    cap: int
    changed: bool


class MarkObserved(NamedTuple):
    """observe_data_set: the data set's mark after this tick, and the loss it noticed.

    ``kind`` is the loss noticed now ('' for none), ``previous`` the id it concerns,
    ``since_loss`` whether a loss happened since what the scheduler remembered.
    """

    id: str
    epoch: int
    seq: int
    kind: str
    previous: str
    since_loss: bool
    created_at_ms: int


def grant(row: Sequence[Any]) -> Grant:
    """Decodes one claim row."""
    item_id, token, lease_id, expires, attempt, payload, takeover, now = row
    return Grant(
        _text(item_id),
        int(token),
        _text(lease_id),
        int(expires),
        int(attempt),
        _text(payload),
        bool(int(takeover)),
        int(now),
    )


def _committed(reply: Sequence[Any]) -> CommitReply:
    status, token, result, done_at = reply
    stored = _text(result)  # '' for a repeated commit whose result was null
    return CommitReply(
        token=int(token),
        result=json.loads(stored) if stored else None,
        done_at_ms=int(done_at),
        repeated=_text(status) == "repeated",
    )


def _failed(reply: Sequence[Any]) -> FailReply:
    state, eligible, attempts, now = reply
    return FailReply(_text(state), int(eligible), int(attempts), int(now))


def _snapshot(reply: Sequence[Any]) -> Snapshot:
    flat_counts, due, held, now, meta, unknown = reply
    counts = {name: int(value) for name, value in _pairs(flat_counts).items()}
    return Snapshot(
        counts,
        _ms(due),
        _ms(held),
        int(now),
        {name: _text(value) for name, value in _pairs(meta).items()},
        _ms(unknown),
    )


def _slot(reply: Sequence[Any]) -> SlotAnswer:
    granted, cap, in_use, *wait = reply
    return SlotAnswer(bool(granted), int(cap), int(in_use), int(wait[0]) if wait else 0)


def _settled(row: Sequence[Any]) -> Settled:
    kind = _text(row[0])
    if kind in ("committed", "repeated"):
        return _committed(row)
    if kind in ("retry", "dead"):
        return _failed(row)
    if kind == "released":
        return Released(int(row[1]))
    if kind == "renewed":
        return Renewed(int(row[1]), int(row[2]))
    return ResponseError(_text(row[1]))


def _mark(reply: Sequence[Any]) -> MarkObserved:
    mark_id, epoch, seq, kind, previous, since, created = reply
    return MarkObserved(
        _text(mark_id),
        int(epoch),
        int(seq),
        _text(kind),
        _text(previous),
        bool(since),
        int(created),
    )


def _effect(reply: Sequence[Any]) -> EffectRecorded:
    key = _text(reply[2]) if len(reply) > 2 else ""
    expires = int(reply[3]) if len(reply) > 3 else 0
    return EffectRecorded(_text(reply[0]), _text(reply[1]), key, expires)


DECODERS: dict[str, Callable[[Any], Any]] = {
    "add_items": lambda reply: [bool(flag) for flag in reply],
    "claim": grant,
    "claim_next": lambda rows: [grant(row) for row in rows],
    "renew": lambda reply: Renewed(int(reply[0]), int(reply[1])),
    "commit": _committed,
    "fail": _failed,
    "release": lambda reply: int(reply[0]),
    "reap": lambda reply: Reaped(int(reply[0]), int(reply[1]), int(reply[2])),
    "cut_leases": lambda reply: Cut(int(reply[0]), int(reply[1]), _text(reply[2])),
    "worker_beat": lambda reply: (int(reply[0]), int(reply[1])),
    "register_shard_job": lambda reply: (bool(reply[0]), int(reply[1])),
    "shard_job_beat": lambda reply: (bool(reply[0]), int(reply[1])),
    "sweep_shard_jobs": lambda reply: Swept(
        int(reply[0]), int(reply[1]), _found(reply[2]), _found(reply[3])
    ),
    "take_shard_jobs": lambda reply: (int(reply[0]), [_text(rq_id) for rq_id in reply[1]]),
    "requeue": int,
    "close_shard": bool,
    "shard_status": _snapshot,
    "create_run": lambda reply: RunCreated(bool(reply[0]), int(reply[1]), int(reply[2])),
    "run_transition": lambda reply: Transition(bool(reply[0]), _text(reply[1]), int(reply[2])),
    "release_lock": bool,
    "record_effect": _effect,
    "settle": lambda rows: [_settled(row) for row in rows],
    "slot_acquire": _slot,
    "slot_release": lambda reply: SlotReleased(int(reply[0]), bool(reply[1])),
    "record_job_failure": int,
    "end_failure_streak": bool,
    "start_backoff": bool,
    "record_age": bool,
    "count_finished": bool,
    "count_missed": lambda reply: [_text(day) for day in reply],
    "record_lost_run": bool,
    "observe_data_set": _mark,
    "tick_leader": lambda reply: LeaderLease(
        bool(reply[0]), int(reply[1]), _text(reply[2]), int(reply[3]), int(reply[4])
    ),
    "tick_lock": int,
    "declare_jobs": lambda reply: (int(reply[0]), int(reply[1])),
}
