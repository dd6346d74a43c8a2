"""Runs whose record vanished before its time: one record each, each loss counted once.

A run is lost when something shows that it existed and should still have its record (it
was open, or its retention has not ended) but the record is gone: eviction, keys
deleted, a server restarted empty or restored from an older copy. The tick finds them
(:mod:`redis_lease.fleet.loss.lost_runs`) and keeps here what it found, for every view:

- ``<prefix>:job:{<job>}:lost`` (hash; ad-hoc runs: ``<prefix>:adhoc:{adhoc}:lost``): run
  id -> its :class:`LostRun` as JSON;
- each loss counted once in its job's tallies (field ``lost``, exported as
  ``redis_lease_lost_runs_total``), in the same script (``lua/record_lost_run.lua``): a
  run lost, made again by the tick (``rerun_at``) and lost again counts twice.

Views show a lost run that was not made again as a run in the state ``lost``
(:func:`lost_status`), and ``status RUN`` names it with what to do (:meth:`LostRun.describe`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from ...errors import NotFound
from ...limits import DAY_MS
from ...limits import LOST_KEPT_DAYS as LOST_KEPT_DAYS  # days a lost run's record is kept
from ...protocol.connection.clients import as_text, queue_time, time_ms
from ...protocol.leases import COUNT_STATES, RunStatus, from_ms
from ...protocol.store.lease_store import LeaseStore
from ..runs.job_tallies import tallies_key
from ..runs.run_states import LOST_STATE, retention_days


@dataclass(frozen=True)
class LostRun:
    """A run whose record vanished: what is known of it, how it was noticed, what to do.

    ``was`` is ``open`` (no end was counted), ``final`` (it had ended) or ``unknown``;
    ``rerun_at_ms`` is set once the tick made it again.
    """

    run_id: str
    job: str
    business_date: str
    created_at_ms: int
    noticed_at_ms: int
    was: str
    why: str
    todo: str
    rerun_at_ms: int = 0

    def describe(self) -> str:
        """One line: when it was noticed, how, and what to do."""
        noticed = from_ms(self.noticed_at_ms).isoformat(timespec="milliseconds")
        return f"its record vanished (noticed {noticed}: {self.why}); {self.todo}"

    def to_json(self) -> str:
        """The record as stored."""
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: Any) -> LostRun | None:
        """A stored record; None when it is not one."""
        try:
            data = json.loads(as_text(raw))
            return cls(**{name: data[name] for name in cls.__dataclass_fields__})
        except (ValueError, TypeError, KeyError):
            return None


def lost_key(store: LeaseStore, job: str) -> str:
    """The lost runs of ``job`` (hash; ``job`` "" for ad-hoc runs)."""
    return store.keys.job_lost(job)


def record(store: LeaseStore, lost: LostRun) -> bool:
    """Keeps the record of a lost run and counts the loss, once per loss; True when counted now."""
    keys = [tallies_key(store, lost.job), lost_key(store, lost.job)]
    with store.translating_errors(lost.run_id):
        counted: bool = store.scripts.call("record_lost_run", keys, [lost.run_id, lost.to_json()])
    return counted


def read(store: LeaseStore, run_id: str) -> LostRun | None:
    """The record of ``run_id`` as a lost run: its job's (the part of the id before ``:``),
    else the ad-hoc runs'; None when it was never found lost."""
    jobs = [run_id.split(":", 1)[0]] if ":" in run_id else []
    with store.translating_errors(run_id):
        pipe = store.client.pipeline(transaction=False)
        for job in [*jobs, ""]:
            pipe.hget(lost_key(store, job), run_id)
        found = [LostRun.from_json(raw) for raw in pipe.execute() if raw is not None]
    return next((lost for lost in found if lost is not None), None)


def of_job(store: LeaseStore, job: str) -> dict[str, LostRun]:
    """Every lost run recorded for ``job`` (``""``: ad-hoc runs)."""
    with store.translating_errors():
        raw = store.client.hgetall(lost_key(store, job))
    found = {as_text(run): LostRun.from_json(value) for run, value in raw.items()}
    return {run: lost for run, lost in found.items() if lost is not None}


def mark_rerun(store: LeaseStore, job: str, run_id: str, at_ms: int) -> None:
    """Notes that ``run_id``, recorded lost, was made again (a later loss counts again)."""
    key = lost_key(store, job)
    with store.translating_errors(run_id):
        lost = LostRun.from_json(store.client.hget(key, run_id) or "")
        if lost is not None and not lost.rerun_at_ms:
            store.client.hset(key, run_id, replace(lost, rerun_at_ms=at_ms).to_json())


def forget_old(store: LeaseStore, job: str, now_ms: int) -> None:
    """Drops the records of runs noticed lost more than :data:`LOST_KEPT_DAYS` ago."""
    old = [
        run
        for run, lost in of_job(store, job).items()
        if lost.noticed_at_ms + LOST_KEPT_DAYS * DAY_MS < now_ms
    ]
    if old:
        with store.translating_errors():
            store.client.hdel(lost_key(store, job), *old)


def lost_status(lost: LostRun, now_ms: int) -> RunStatus:
    """A lost run as a run's status in the state ``lost``, with no items: for listings."""
    info = {
        "job": lost.job,
        "business_date": lost.business_date,
        "created_at": str(lost.created_at_ms) if lost.created_at_ms else "",
        "reason": f"lost: {lost.describe()}",
        "lost_at": str(lost.noticed_at_ms),
    }
    return RunStatus(
        run_id=lost.run_id,
        shards=0,
        state=LOST_STATE,
        counts=dict.fromkeys(COUNT_STATES, 0),
        counters={},
        oldest_eligible_age_seconds=0.0,
        oldest_leased_age_seconds=0.0,
        now_ms=now_ms,
        info={name: value for name, value in info.items() if value},
    )


def gone(store: LeaseStore, run_id: str) -> NotFound | None:
    """The error for a run with no record when something shows it existed, else None.

    A run the tick found lost and did not make again is named lost, with what to do.
    Other evidence: the run index, the job's open runs, or the run's event log.
    """
    lost = read(store, run_id)
    if lost is not None and not lost.rerun_at_ms:
        return NotFound(f"run {run_id!r} was lost: {lost.describe()}", run_id=run_id)
    job = run_id.split(":", 1)[0]
    with store.translating_errors(run_id):
        pipe = store.client.pipeline(transaction=False)
        pipe.zscore(store.keys.runs, run_id)
        pipe.sismember(store.keys.job_open_runs(job), run_id)
        pipe.exists(store.keys.run_events(run_id))
        pipe.hget(store.keys.job(job), "retention_days")
        queue_time(pipe)
        created, listed_open, logged, retention, now = pipe.execute()
    if created is None and not listed_open and not logged:
        return None
    days = retention_days({"retention_days": as_text(retention) if retention else ""})
    kept_until = (created or 0) + days * DAY_MS
    if not listed_open and not logged and kept_until < time_ms(now):
        return NotFound(
            f"run {run_id!r} is gone: its retention has ended; nothing to do", run_id=run_id
        )
    return NotFound(
        f"run {run_id!r} is gone: the server may have lost its data: check persistence "
        "(docs/durability.md)",
        run_id=run_id,
    )


__all__ = [
    "LOST_KEPT_DAYS",
    "LostRun",
    "forget_old",
    "gone",
    "lost_key",
    "lost_status",
    "mark_rerun",
    "of_job",
    "read",
    "record",
]
