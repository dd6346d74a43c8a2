"""A run's status, read from its record and every shard in one round trip.

Plain reads in one ``MULTI``/``EXEC``, so every shard is read at the same instant of
the server clock (``TIME`` inside it): per shard its counters (``HGETALL``), the
sizes of its three state indexes (``ZCARD``) and the first entries of its time
indexes (``ZRANGE 0 0``). The run's counts are their sums and its ages come from
those first entries: O(shards), whatever the run's size. No script and no meta hash
(``shard_status.lua`` gives the same per shard to clients in other languages, the
unknown effects' first entry too, as the same :class:`~..replies.Snapshot`;
tests/test_effects.py keeps the two equal).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import redis

from ...errors import NotFound, RedisFull
from ...limits import FINAL_RUN_STATES, RUNNING
from ..connection.clients import as_text, queue_time, time_ms
from ..leases import COUNT_STATES, RunStatus
from ..replies import Snapshot

if TYPE_CHECKING:
    from .store_client import StoreBase

#: The reads of one shard, in order, after its counters.
_PER_SHARD = 7


def read(store: StoreBase, run_id: str) -> tuple[dict[str, str], list[Snapshot]]:
    """The run's record and a snapshot of each of its shards, in one round trip; raises
    NotFound when the run has no record (also when its shard count was known before).

    One moment on one server (a transaction), except on a full Redis, which refuses every
    command queued in a transaction: then the same reads go as a plain pipeline, so that
    the views still answer (each read is exact, the moments a few microseconds apart)."""
    try:
        return _read(store, run_id, transaction=not store.on_cluster)
    except RedisFull:
        return _read(store, run_id, transaction=False)


def _read(
    store: StoreBase, run_id: str, transaction: bool
) -> tuple[dict[str, str], list[Snapshot]]:
    count = store.shard_count(run_id)
    with store.translating_errors(run_id):
        # On a cluster each node answers for its own shards.
        pipe = store.client.pipeline(transaction=transaction)
        queue_time(pipe)
        pipe.hgetall(store.keys.run(run_id))
        for shard in range(count):
            _meta, counts, _items, due, leases, held, dead = store.keys.shard(run_id, shard)
            pipe.hgetall(counts)
            pipe.zcard(due)
            pipe.zcard(leases)
            pipe.zcard(dead)
            pipe.zrange(due, 0, 0, withscores=True)
            pipe.zrange(held, 0, 0, withscores=True)
            pipe.zrange(store.keys.effects(run_id, shard)[1], 0, 0, withscores=True)
        replies = pipe.execute(raise_on_error=False)
    for reply in replies:
        if isinstance(reply, redis.ResponseError):
            raise store.translating_errors(run_id).error(reply)
    now_reply, info_raw, *shards = replies
    if not info_raw:  # the shard count was known, the record is gone since (lost or expired)
        raise NotFound.run(run_id, then="add items to create it")
    now = time_ms(now_reply)
    snapshots = [_shard(now, shards[i : i + _PER_SHARD]) for i in range(0, len(shards), _PER_SHARD)]
    return {as_text(k): as_text(v) for k, v in info_raw.items()}, snapshots


def _shard(now: int, reads: list[Any]) -> Snapshot:
    counters, pending, leased, dead, first_due, first_held, first_unknown = reads
    counts = {as_text(name): int(value) for name, value in counters.items()}
    counts.update(pending=int(pending), leased=int(leased), dead=int(dead))
    for state in COUNT_STATES:
        counts.setdefault(state, 0)
    return Snapshot(
        counts,
        first_due_ms=_first_score(first_due),
        first_held_ms=_first_score(first_held),
        now_ms=now,
        meta={},  # the shard's settings: read only by the script
        first_unknown_ms=_first_score(first_unknown),
    )


def _first_score(reply: list[Any]) -> int | None:
    """The score of a ``ZRANGE ... WITHSCORES`` reply's first member (pairs, or flat)."""
    if not reply:
        return None
    first = reply[0]
    return int(float(first[1] if isinstance(first, list | tuple) else reply[1]))


def run_status(store: StoreBase, run_id: str) -> RunStatus:
    """Counts, event counters and ages of a run."""
    return summary(run_id, *read(store, run_id))


def summary(run_id: str, info: dict[str, str], snapshots: list[Snapshot]) -> RunStatus:
    """The run's status from its record and its shards' snapshots."""
    totals: dict[str, int] = {}
    for snap in snapshots:
        for name, value in snap.counts.items():
            totals[name] = totals.get(name, 0) + value
    now = max((snap.now_ms for snap in snapshots), default=0)
    # A final run's eligible items wait for nothing: their age stops at the run's end.
    ended = info.get("state_at", "")
    final = info.get("state") in FINAL_RUN_STATES and ended.isdigit()
    eligible_until = min(now, int(ended)) if final else now

    def oldest(times: Iterable[int | None], until: int = now) -> float:
        ages = [until - t for t in times if t is not None and t <= until]
        return max(ages, default=0) / 1000

    counts = {state: totals.pop(state, 0) for state in COUNT_STATES}
    return RunStatus(
        run_id=run_id,
        shards=len(snapshots),
        state=info.get("state", RUNNING),
        counts=counts,
        counters=totals,
        oldest_eligible_age_seconds=oldest((s.first_due_ms for s in snapshots), eligible_until),
        oldest_leased_age_seconds=oldest(s.first_held_ms for s in snapshots),
        oldest_unknown_effect_age_seconds=oldest(s.first_unknown_ms for s in snapshots),
        now_ms=now,
        info=info,
    )
