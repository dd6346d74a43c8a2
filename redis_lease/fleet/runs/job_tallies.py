"""Counters kept in Redis per job, for the exporter: runs finished by final state,
scheduled runs that were never created (missed), and runs lost.

One hash per job, ``<prefix>:job:{<job>}:tallies``, with the fields ``finished:<state>``,
``missed`` and ``lost``; ad-hoc runs (no job) count under ``<prefix>:adhoc:{adhoc}:tallies``.
Each count is one script on the job's slot (``lua/count_finished.lua``,
``count_missed.lua``, ``record_lost_run.lua``), so it is counted once:

- a run is counted each time it becomes final, once per end: the job's ``finished_runs``
  sorted set holds ``<run>@<state_at>`` (the end's time, set by the state change) with
  the time the entry may go as its score; a run that is resumed and ends again is
  counted again (a new ``state_at``), a repeated call for the same end is not. Entries
  leave once their own expiry passed (the run's retention and a day), when the run's
  keys are gone and that end cannot be counted again;
- a missed date is counted when the tick marks it skipped in the job's dates
  (``ZADD NX``): a date marked before (or made by a backfill) is not counted again;
- a lost run is counted with its record (:func:`redis_lease.fleet.loss.lost_records.record`), once
  per loss.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from ...limits import BATCH_MAX, DAY_MS
from ...protocol.connection.clients import as_text
from ...protocol.store.lease_store import LeaseStore
from .run_states import FINAL_STATES


@dataclass(frozen=True)
class Tallies:
    """A job's counters: runs finished by final state, missed scheduled runs, lost runs."""

    finished: dict[str, int] = field(default_factory=dict)
    missed: int = 0
    lost: int = 0


def tallies_key(store: LeaseStore, job: str) -> str:
    """The job's counters (hash); ``job`` "" for ad-hoc runs."""
    return store.keys.job_tallies(job)


def counted_runs_key(store: LeaseStore, job: str) -> str:
    """The job's counted ends (sorted set: ``<run>@<state_at>`` -> ms the entry may go)."""
    return store.keys.job_counted_runs(job)


def count_finished(
    store: LeaseStore, job: str, run_id: str, state: str, ended_ms: int, retention_days: int
) -> bool:
    """Counts the end of a run in ``state`` at ``ended_ms`` (its ``state_at``), once per
    end; True when counted now."""
    keep_ms = (retention_days + 1) * DAY_MS
    keys = [tallies_key(store, job), counted_runs_key(store, job)]
    with store.translating_errors(run_id):
        counted: bool = store.scripts.call(
            "count_finished", keys, [f"{run_id}@{ended_ms}", state, keep_ms]
        )
    return counted


def count_missed(store: LeaseStore, job: str, days: Sequence[str]) -> list[str]:
    """Marks the job's ``days`` (ISO dates) skipped and counts those not marked or made
    before as missed; returns them."""
    keys = [tallies_key(store, job), store.keys.job_dates(job)]
    marked: list[str] = []
    with store.translating_errors():
        for start in range(0, len(days), BATCH_MAX):  # the script takes at most BATCH_MAX
            marked += store.scripts.call(
                "count_missed", keys, list(days[start : start + BATCH_MAX])
            )
    return marked


def read(store: LeaseStore, jobs: Iterable[str]) -> dict[str, Tallies]:
    """The counters of ``jobs`` (one round trip); a job with none has zeros."""
    names = list(jobs)
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        for job in names:
            pipe.hgetall(tallies_key(store, job))
        replies = pipe.execute() if names else []
    found = {}
    for job, raw in zip(names, replies, strict=True):
        fields = {as_text(k): int(v) for k, v in (raw or {}).items()}
        finished = {s: fields.get(f"finished:{s}", 0) for s in FINAL_STATES}
        found[job] = Tallies(finished, fields.get("missed", 0), fields.get("lost", 0))
    return found


__all__ = [
    "Tallies",
    "count_finished",
    "count_missed",
    "counted_runs_key",
    "read",
    "tallies_key",
]
