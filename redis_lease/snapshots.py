"""A run's status, read from its record and every shard in one round trip.

Each shard answers with one consistent snapshot (``shard_status.lua``) on the
server clock; the run's counts are their sums and its ages come from the first
entries of the shards' time indexes: O(shards), whatever the run's size.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import redis

from .connection import as_text
from .lease import COUNT_STATES, RunStatus
from .replies import Snapshot
from .scripts import Call, Command

if TYPE_CHECKING:
    from .store import LeaseStore


@dataclass(frozen=True)
class ShardSnapshot:
    """One shard's counters and the first entries of its time indexes (ms)."""

    counts: dict[str, int]
    first_due: int | None
    first_held: int | None
    first_unknown: int | None
    now: int


def read(store: LeaseStore, run_id: str) -> tuple[dict[str, str], list[ShardSnapshot]]:
    """The run's record and a snapshot of each of its shards, in one round trip."""
    count = store.shard_count(run_id)
    calls: list[Call | Command] = [Command(("HGETALL", store.keys.run(run_id)))]
    for shard in range(count):
        calls.append(Call("shard_status", store.keys.shard(run_id, shard), []))
        calls.append(Command(("ZRANGE", store.keys.effects(run_id, shard)[1], 0, 0, "WITHSCORES")))
    with store.errors(run_id):
        info_raw, *replies = store.scripts.many(calls)
    for reply in [info_raw, *replies]:
        if isinstance(reply, redis.ResponseError):
            raise store.translate(reply, run_id)
    snapshots = [
        _shard(reply, unknown) for reply, unknown in zip(replies[::2], replies[1::2], strict=True)
    ]
    return {as_text(k): as_text(v) for k, v in info_raw.items()}, snapshots


def _shard(reply: Snapshot, unknown: list[Any]) -> ShardSnapshot:
    counts = dict(reply.counts)
    for state in COUNT_STATES:
        counts.setdefault(state, 0)
    first_unknown = _first_score(unknown)
    return ShardSnapshot(
        counts, reply.first_due_ms, reply.first_held_ms, first_unknown, reply.now_ms
    )


def _first_score(reply: list[Any]) -> int | None:
    """The score of a ``ZRANGE ... WITHSCORES`` reply's first member (pairs, or flat)."""
    if not reply:
        return None
    first = reply[0]
    return int(float(first[1] if isinstance(first, list | tuple) else reply[1]))


def run_status(store: LeaseStore, run_id: str) -> RunStatus:
    """Counts, event counters and ages of a run."""
    return summary(run_id, *read(store, run_id))


def summary(run_id: str, info: dict[str, str], snapshots: list[ShardSnapshot]) -> RunStatus:
    """The run's status from its record and its shards' snapshots."""
    totals: dict[str, int] = {}
    for snap in snapshots:
        for name, value in snap.counts.items():
            totals[name] = totals.get(name, 0) + value
    now = max((snap.now for snap in snapshots), default=0)

    def oldest(times: Iterable[int | None]) -> float:
        ages = [now - t for t in times if t is not None and t <= now]
        return max(ages, default=0) / 1000

    counts = {state: totals.pop(state, 0) for state in COUNT_STATES}
    return RunStatus(
        run_id=run_id,
        shards=len(snapshots),
        state=info.get("state", "running"),
        counts=counts,
        events=totals,
        oldest_eligible_age_seconds=oldest(s.first_due for s in snapshots),
        oldest_leased_age_seconds=oldest(s.first_held for s in snapshots),
        oldest_unknown_effect_age_seconds=oldest(s.first_unknown for s in snapshots),
        now_ms=now,
        info=info,
    )
