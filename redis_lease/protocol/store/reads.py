"""What a LeaseStore reads without a script: item records, attempts, effects, and a
run's status from one round trip of plain reads."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import NotFound
from ...limits import ATTEMPT_LOG_CAP
from ..connection.clients import as_text
from ..keys import shard_of
from ..leases import TEXT_SUFFIXES, Attempt, ItemRecord, RunStatus, effect_record, read_items
from ..validation import check_positive
from . import attempt_log, run_status
from .store_client import StoreBase


class StoreReads(StoreBase):
    """The reads of a store (see :class:`~.lease_store.LeaseStore`)."""

    def item(self, run_id: str, item_id: str) -> ItemRecord:
        """The stored record of an item; raises NotFound."""
        shard = self.shard_for(run_id, item_id)
        fields = [item_id, *(item_id + suffix for suffix in TEXT_SUFFIXES.values())]
        with self.translating_errors(run_id, item_id):
            raw, result, error = self.client.hmget(self.keys.shard(run_id, shard)[2], fields)
        if raw is None:
            raise NotFound(
                f"item {item_id!r} not found in run {run_id!r}", run_id=run_id, item_id=item_id
            )
        return ItemRecord.from_record(run_id, item_id, shard, raw, result, error)

    def records(self, run_id: str, shard: int, item_ids: Sequence[str]) -> list[ItemRecord | None]:
        """The records of ``item_ids`` in one shard, in order (None where there is none);
        one HMGET."""
        if not item_ids:
            return []
        suffixes = ("", *TEXT_SUFFIXES.values())
        fields = [f"{item}{suffix}" for item in item_ids for suffix in suffixes]
        with self.translating_errors(run_id):
            raw = self.client.hmget(self.keys.shard(run_id, shard)[2], fields)
        width = len(suffixes)
        records: list[ItemRecord | None] = []
        for number, item in enumerate(item_ids):
            record, result, error = raw[number * width : (number + 1) * width]
            records.append(
                ItemRecord.from_record(run_id, item, shard, record, result, error)
                if record is not None
                else None
            )
        return records

    def unknown_items(self, run_id: str, item_ids: Sequence[str]) -> list[str]:
        """The ids of ``item_ids`` that have no record in the run (one HMGET per shard);
        raises NotFound for an unknown run."""
        shards = self.shard_count(run_id)
        by_shard: dict[int, list[str]] = {}
        for item in item_ids:
            by_shard.setdefault(shard_of(item, shards), []).append(item)
        missing: set[str] = set()
        for shard, ids in sorted(by_shard.items()):
            for item, record in zip(ids, self.records(run_id, shard, ids), strict=True):
                if record is None:
                    missing.add(item)
        return [item for item in item_ids if item in missing]

    def items(self, run_id: str, shard: int) -> Iterator[ItemRecord]:
        """Every item record of one shard (HSCAN: cursor-based, never blocks Redis)."""
        fields: dict[str, Any] = {}
        with self.translating_errors(run_id):
            for field_name, raw in self.client.hscan_iter(
                self.keys.shard(run_id, shard)[2], count=500
            ):
                fields[as_text(field_name)] = raw
        for item_id, rec in read_items(fields).items():
            yield ItemRecord.from_record(
                run_id,
                item_id,
                shard,
                fields[item_id],
                *(rec.get(name) for name in TEXT_SUFFIXES),
            )

    def attempts(
        self, run_id: str, item_id: str | None = None, *, limit: int = 50
    ) -> list[Attempt]:
        """The attempt log, newest first: the run's latest ``limit`` entries over every shard,
        or ``item_id``'s latest (read from its shard's log alone, never more than its cap).

        Each shard keeps its last limits.ATTEMPT_LOG_CAP entries (about). Raises NotFound for
        an unknown run, InvalidInput for a bad id or a limit outside 1 to the cap.
        """
        check_positive(limit, "limit", ATTEMPT_LOG_CAP)
        if item_id is not None:
            shard = self.shard_for(run_id, item_id)
            with self.translating_errors(run_id, item_id):
                return attempt_log.item_attempts(
                    self.client, self.keys.attempts(run_id, shard), item_id, limit
                )
        keys = [self.keys.attempts(run_id, shard) for shard in range(self.shard_count(run_id))]
        with self.translating_errors(run_id):
            return attempt_log.latest(self.client, keys, limit)

    def effect(self, run_id: str, item_id: str, key: str) -> dict[str, Any] | None:
        """The effect record ``key`` of an item, or None."""
        shard = self.shard_for(run_id, item_id)
        with self.translating_errors(run_id, item_id):
            raw = self.client.hget(self.keys.effects(run_id, shard)[0], key)
        return effect_record(raw) if raw else None

    def effects(self, run_id: str) -> Iterator[tuple[str, dict[str, Any]]]:
        """Every effect record of the run: (idempotency key, record)."""
        for shard in range(self.shard_count(run_id)):
            with self.translating_errors(run_id):
                for key, raw in self.client.hscan_iter(self.keys.effects(run_id, shard)[0]):
                    yield as_text(key), effect_record(raw)

    def shard_counts(self, run_id: str) -> list[dict[str, int]]:
        """Per shard, the item counts by state and the event counters."""
        return [snap.counts for snap in run_status.read(self, run_id)[1]]

    def status(self, run_id: str) -> RunStatus:
        """Counts, event counters and ages of a run: O(shards), one round trip."""
        return run_status.run_status(self, run_id)

    def status_by_shard(self, run_id: str) -> tuple[RunStatus, list[dict[str, int]]]:
        """The run's status and each shard's counts, from the same round trip."""
        info, shards = run_status.read(self, run_id)
        return run_status.summary(run_id, info, shards), [snap.counts for snap in shards]

    def run_ids(self) -> list[str]:
        """Every run id, oldest first."""
        with self.translating_errors():
            return [as_text(r) for r in self.client.zrange(self.keys.runs, 0, -1)]
