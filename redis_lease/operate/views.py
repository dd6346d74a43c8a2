"""Operator reads of a run that never load the whole run: pages of items, an item's effects,
the providers' caps, the run ids and statuses of a listing and which runs it shows
(:class:`RunFilter`). The rows the CLI's views and
the dashboard make of them are in :mod:`redis_lease.operate.run_views`.

A page of one state (pending, leased, dead) comes from that state's index (a sorted set
per shard: pending by eligible time, leased by lease expiry, dead by time of death) with
``ZRANGE`` by rank; a page of every state, or of ``done`` (which has no index), comes from
``HSCAN`` over each shard's items hash. A :class:`Page` ends with the cursor of the next
one, ``<shard>:<position>`` (a rank, or an ``HSCAN`` cursor), or None after the last.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidInput, NotFound
from ..fleet.effects.ledger import SEPARATOR
from ..fleet.effects.provider_gate import GateState, ProviderGate
from ..fleet.loss import lost_records
from ..fleet.runs.run_states import RUN_STATES
from ..limits import PAGE_MAX, PAGE_SIZE
from ..protocol.connection.clients import as_text
from ..protocol.keys import SHARD_KEY_NAMES
from ..protocol.leases import COUNT_STATES, ItemRecord, RunStatus, effect_record
from ..protocol.store.lease_store import LeaseStore
from ..protocol.validation import check_id

#: The index (a shard key name) of each state that has one; its score is a time in ms.
STATE_INDEX = {"pending": "due", "leased": "leases", "dead": "dead"}
#: What the score of each state's index means.
SCORE_MEANING = {"pending": "eligible_at", "leased": "expires_at", "dead": "dead_at"}
#: Most HSCAN calls for one page: a page of a rare state ends early, with its cursor.
SCAN_STEPS_MAX = 64


@dataclass(frozen=True)
class Page:
    """Items of a run, with the index time of each (None from a scan) and the next cursor."""

    records: list[ItemRecord]
    times_ms: list[int | None]
    next_cursor: str | None


def parse_cursor(cursor: str | None, shards: int) -> tuple[int, int]:
    """The (shard, position) of a cursor printed by a previous page; (0, 0) for none.

    Raises:
        InvalidInput: the cursor is not ``<shard>:<position>`` of this run.
    """
    if cursor is None or cursor == "":
        return 0, 0
    shard_text, colon, position_text = cursor.partition(":")
    if not (colon and shard_text.isdigit() and position_text.isdigit()):
        raise InvalidInput(
            f"cursor {cursor!r} is not one a page printed (<shard>:<position>, e.g. 0:100)"
        )
    shard, position = int(shard_text), int(position_text)
    if shard >= shards or len(position_text) > 20:
        raise InvalidInput(f"cursor {cursor!r} does not belong to this run ({shards} shard(s))")
    return shard, position


def check_state(state: str | None) -> str | None:
    """``state`` when it is an item state (or None); raises InvalidInput otherwise."""
    if state is not None and state not in COUNT_STATES:
        raise InvalidInput(f"state {state!r} is not one of {', '.join(COUNT_STATES)}")
    return state


def check_page(run_id: str, state: str | None, limit: int) -> None:
    """What :func:`items_page` checks before it reads: the run id, the state and the limit."""
    check_id(run_id, "run id")
    check_state(state)
    if not 1 <= limit <= PAGE_MAX:
        raise InvalidInput(f"limit {limit} out of range: 1 to {PAGE_MAX}")


def items_page(
    store: LeaseStore, run_id: str, state: str | None, limit: int, cursor: str | None = None
) -> Page:
    """One page of the run's items of ``state`` (None: every state), from ``cursor``.

    A page from an index holds at most ``limit`` items; a page from a scan
    (``done``, or every state) ends with the scan batch that reaches ``limit``, so it
    may hold a few more, or after SCAN_STEPS_MAX scan calls, so a page of a rare
    state may hold fewer (even none) and still have a next cursor. Items that move
    between pages may be shown twice or, from an index, missed: a page is a view of
    a run at work, not a snapshot.

    Raises:
        NotFound: no such run. InvalidInput: a bad state, limit or cursor.
    """
    check_page(run_id, state, limit)
    shards = store.shard_count(run_id)
    shard, position = parse_cursor(cursor, shards)
    if state in STATE_INDEX:
        return _index_page(store, run_id, state, limit, shards, shard, position)
    return _scan_page(store, run_id, state, limit, shards, shard, position)


def _index_page(
    store: LeaseStore, run_id: str, state: str, limit: int, shards: int, shard: int, rank: int
) -> Page:
    records: list[ItemRecord] = []
    times: list[int | None] = []
    index = SHARD_KEY_NAMES.index(STATE_INDEX[state])
    while shard < shards:
        want = limit - len(records)
        with store.translating_errors(run_id):  # one more than wanted: is there a next page here?
            entries: list[tuple[Any, float]] = store.client.zrange(  # type: ignore[assignment]
                store.keys.shard(run_id, shard)[index], rank, rank + want, withscores=True
            )
        more = len(entries) > want
        entries = entries[:want]
        ids = [as_text(member) for member, _ in entries]
        for record, (_, score) in zip(_records(store, run_id, shard, ids), entries, strict=True):
            if record is not None:  # an index entry whose record vanished is not shown
                records.append(record)
                times.append(int(score))
        if more:
            return Page(records, times, f"{shard}:{rank + want}")
        if len(records) == limit:
            following = shard + 1 < shards
            return Page(records, times, f"{shard + 1}:0" if following else None)
        shard, rank = shard + 1, 0
    return Page(records, times, None)


def _scan_page(
    store: LeaseStore,
    run_id: str,
    state: str | None,
    limit: int,
    shards: int,
    shard: int,
    position: int,
) -> Page:
    records: list[ItemRecord] = []
    for _ in range(SCAN_STEPS_MAX):
        if shard >= shards:
            break
        items_key = store.keys.shard(run_id, shard)[2]
        with store.translating_errors(run_id):
            position, fields = store.client.hscan(items_key, position, count=limit)
        ids = sorted(as_text(f) for f in fields if "#" not in as_text(f))
        for record in _records(store, run_id, shard, ids):
            if record is not None and (state is None or record.state == state):
                records.append(record)
        if position == 0:
            shard += 1
        if len(records) >= limit:
            break
    cursor = f"{shard}:{position}" if shard < shards else None
    return Page(records, [None] * len(records), cursor)


def _records(
    store: LeaseStore, run_id: str, shard: int, ids: Sequence[str]
) -> list[ItemRecord | None]:
    """The records of ``ids`` in one shard, in order (None where there is none); one HMGET."""
    return store.records(run_id, shard, ids)


def unknown_items(store: LeaseStore, run_id: str, item_ids: Sequence[str]) -> list[str]:
    """The ids of ``item_ids`` that have no record in the run (one HMGET per shard)."""
    return store.unknown_items(run_id, item_ids)


def item_effects(store: LeaseStore, run_id: str, item_id: str) -> list[tuple[str, dict[str, Any]]]:
    """The item's effect records (idempotency key, record), by key.

    Scans its shard's ledger for keys of this item (``<run>|<item>|<effect>``); a record
    that names its item is kept only when it names this one.
    """
    shard = store.shard_for(run_id, item_id)
    ledger = store.keys.effects(run_id, shard)[0]
    found: dict[str, dict[str, Any]] = {}
    pattern = _glob_escape(f"{run_id}{SEPARATOR}{item_id}{SEPARATOR}") + "*"
    with store.translating_errors(run_id, item_id):
        for key, raw in store.client.hscan_iter(ledger, match=pattern, count=500):
            record = effect_record(raw)
            if record.get("item", item_id) == item_id:
                found[as_text(key)] = record
    return sorted(found.items())


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN MATCH pattern."""
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def providers(store: LeaseStore) -> list[GateState]:
    """Every provider gate under the store's prefix with its cap, slots and throttles."""
    pattern = store.keys.providers_pattern
    names: set[str] = set()
    with store.translating_errors():
        for key in store.client.scan_iter(match=pattern, count=500):
            names.add(as_text(key).split("{", 1)[1].rsplit("}", 1)[0])
    return [ProviderGate(store, name, max_concurrency=1).state() for name in sorted(names)]


def run_ids_since(store: LeaseStore, since_ms: int | None = None) -> list[str]:
    """Run ids created at or after ``since_ms`` (every run for None), newest first."""
    low = "-inf" if since_ms is None else since_ms
    with store.translating_errors():
        ids = store.client.zrevrangebyscore(store.keys.runs, "+inf", low)
    return [as_text(run_id) for run_id in ids]


def run_statuses(store: LeaseStore, run_ids: Iterable[str]) -> Iterator[RunStatus]:
    """The status of each run, in order. A run the tick found lost and did not make again
    is shown in the state ``lost`` (:func:`redis_lease.fleet.loss.lost_records.lost_status`); any
    other run whose record is gone (its retention ended) is left out."""
    for run_id in run_ids:
        try:
            yield store.status(run_id)
        except NotFound:
            lost = lost_records.read(store, run_id)
            if lost is not None and not lost.rerun_at_ms:
                yield lost_records.lost_status(lost, lost.noticed_at_ms)


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing shows, newest first: only ``job``'s, only those in ``state``
    (None: any), at most ``limit`` of them; checked when made.

    Raises:
        InvalidInput: the job, the state or the limit is not acceptable.
    """

    job: str | None = None
    state: str | None = None
    limit: int = PAGE_SIZE

    def __post_init__(self) -> None:
        if self.job is not None:
            check_id(self.job, "job")
        if self.state is not None and self.state not in RUN_STATES:
            raise InvalidInput(f"state {self.state!r} is not one of {', '.join(RUN_STATES)}")
        if not 1 <= self.limit <= PAGE_MAX:
            raise InvalidInput(f"limit {self.limit} out of range: 1 to {PAGE_MAX}")

    def candidates(self, store: LeaseStore, since_ms: int | None = None) -> list[str]:
        """The ids of the runs created since ``since_ms`` that may be the job's, newest first."""
        prefix = f"{self.job}:"
        ids = run_ids_since(store, since_ms)
        return [r for r in ids if self.job is None or r.startswith(prefix)]

    def matching(self, store: LeaseStore, run_ids: Iterable[str]) -> list[RunStatus]:
        """The statuses of the runs of ``run_ids`` that match, in order, up to the limit (no
        more of ``run_ids`` is read once it is reached)."""
        shown: list[RunStatus] = []
        for one in run_statuses(store, run_ids):
            if self.job is not None and one.info.get("job") != self.job:
                continue
            if self.state is None or one.state == self.state:
                shown.append(one)
            if len(shown) == self.limit:
                break
        return shown
