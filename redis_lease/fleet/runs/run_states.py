"""A run's states, what each allows, and how long a finished run is kept: defined once,
for the modules that change runs (:mod:`redis_lease.fleet.runs.lifecycle`), count them
(:mod:`redis_lease.fleet.runs.job_tallies`), show them (:mod:`redis_lease.operate`, the
command line) and export them (:mod:`redis_lease.operate.metrics.collector`).

A run is planning, then running, then ends succeeded, partial, failed or canceled.
An operator may resume a partial or failed run (some of its items are still to do). A
canceled run is final: an operator ended it on purpose, and resuming it would re-apply
work they meant to stop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ...limits import (
    CANCELED,
    DAY_MS,
    DEFAULT_RETENTION_DAYS,
    FAILED,
    FINAL_RUN_STATES,
    OPEN_RUN_STATES,
    PARTIAL,
    PLANNING,
    RUNNING,
    SUCCEEDED,
)

if TYPE_CHECKING:  # the names of runs' states are read where the store is not needed
    from ...protocol.leases import RunStatus
    from ...protocol.store.lease_store import LeaseStore

# The words are the protocol's (lua/include/limits.json, through limits.py); the rules are here.
#: States of a run still being worked.
OPEN_STATES = OPEN_RUN_STATES
#: States a run ends in.
FINAL_STATES = FINAL_RUN_STATES
#: Final states an operator may reopen (``resume``): runs with items still to do.
RESUMABLE_STATES = (PARTIAL, FAILED)
#: States an operator may cancel (``cancel``): the open ones.
CANCELABLE_STATES = OPEN_STATES
#: What views show for a run whose record vanished and that was not made again.
LOST_STATE = "lost"
#: Every state a view shows: the stored ones and :data:`LOST_STATE`.
RUN_STATES = (*OPEN_STATES, *FINAL_STATES, LOST_STATE)
#: Why items of a run vanished, in the run's accounting.
LOST_HINT = "records vanished: check maxmemory-policy and persistence"


def in_words(states: tuple[str, ...]) -> str:
    """States as a reader says them: ``partial or failed``, ``a, b or c``."""
    return " or ".join([", ".join(states[:-1]), states[-1]] if len(states) > 1 else states)


def not_resumable(run_id: str, info: dict[str, str]) -> str | None:
    """Why the run (its record) may not be resumed, in one line; None when it may."""
    state = info.get("state", "")
    if state in RESUMABLE_STATES:
        return None
    only = f"only {in_words(RESUMABLE_STATES)} runs resume"
    if state != CANCELED:
        return f"run {run_id!r} is {state}; {only}"
    job, day = info.get("job"), info.get("business_date")
    again = (
        f"to run {day} again, `redis-lease start JOB --date {day}` once its retention has ended"
        if job and day
        else "to work its items again, add them to a new run (`redis-lease add`)"
    )
    return f"run {run_id!r} is canceled, which is final ({only}); {again}"


def final_state(status: RunStatus) -> str:
    """succeeded when the run is complete, else partial (some done) or failed (none)."""
    if status.complete:
        return SUCCEEDED
    return PARTIAL if status.counts["done"] > 0 else FAILED


def accounting(status: RunStatus) -> str:
    """The run's counts in words, e.g. ``90 done of 100 planned, 5 pending, 5 lost (...)``."""
    parts = [f"{status.counts['done']} done of {status.planned} planned"]
    parts += [f"{status.counts[s]} {s}" for s in ("pending", "leased", "dead") if status.counts[s]]
    if status.lost:
        parts.append(f"{status.lost} lost ({LOST_HINT})")
    if status.late:
        parts.append(f"{status.late} committed after the deadline")
    return ", ".join(parts)


# -- retention ----------------------------------------------------------------


def retention_days(info: dict[str, str]) -> int:
    """Days a finished run is kept, from its record; the default when the record has no
    valid ``retention_days`` (a whole number above 0)."""
    text = info.get("retention_days", "")
    return int(text) if text.isdigit() and int(text) > 0 else DEFAULT_RETENTION_DAYS


def kept_until_ms(info: dict[str, str]) -> int | None:
    """When a final run's retention ends (ms), from its record; None while it is open
    or when the record does not say when it ended."""
    if info.get("state") not in FINAL_STATES or not info.get("state_at", "").isdigit():
        return None
    return int(info["state_at"]) + retention_days(info) * DAY_MS


def run_keys(store: LeaseStore, run_id: str) -> list[str]:
    """Every key of a run: its record, log, RQ jobs and measured capacity, and each
    shard's keys, attempt log and ledger; all expire when the run's retention ends."""
    keys = store.keys
    found = [keys.run(run_id), keys.run_events(run_id), keys.run_jobs(run_id)]
    found += [keys.run_jobs_missing(run_id), keys.run_capacity(run_id), keys.run_ages(run_id)]
    for shard in range(store.shard_count(run_id)):
        found += keys.logged(run_id, shard) + keys.effects(run_id, shard)
    return found


def retire(store: LeaseStore, job_name: str, run_id: str, days: int) -> None:
    """Drops the run from its job's open runs and lets its keys expire in ``days``."""
    with store.translating_errors(run_id):
        pipe = store.client.pipeline(transaction=False)
        if job_name:
            pipe.srem(store.keys.job_open_runs(job_name), run_id)
        for key in run_keys(store, run_id):
            pipe.pexpire(key, days * DAY_MS)
        pipe.execute()


def reopen(store: LeaseStore, job_name: str, run_id: str) -> None:
    """Undoes :func:`retire`: lists the run among its job's open runs and keeps its keys."""
    with store.translating_errors(run_id):
        pipe = store.client.pipeline(transaction=False)
        if job_name:
            pipe.sadd(store.keys.job_open_runs(job_name), run_id)
        for key in run_keys(store, run_id):
            pipe.persist(key)
        pipe.execute()


__all__ = [
    "CANCELABLE_STATES",
    "CANCELED",
    "FAILED",
    "FINAL_STATES",
    "LOST_HINT",
    "LOST_STATE",
    "OPEN_STATES",
    "PARTIAL",
    "PLANNING",
    "RESUMABLE_STATES",
    "RUNNING",
    "RUN_STATES",
    "SUCCEEDED",
    "accounting",
    "final_state",
    "in_words",
    "kept_until_ms",
    "not_resumable",
    "reopen",
    "retention_days",
    "retire",
    "run_keys",
]
