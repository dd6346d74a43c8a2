"""What a tick does after a loss of data.

It makes a job's lost runs again where its schedule and catch-up policy cover them, and
names them where not. It marks open runs with the loss, and names lost ad-hoc runs.

Each tick of a job (:func:`recover`, after :func:`redis_lease.fleet.loss.data_set_mark.observe`)
looks for runs with no record among those something shows existed:

- the job's open runs (an open run has no expiry: its record cannot be gone);
- the job's dates made within its retention (the record of a run made then is kept at
  least that long), unless the run's end was counted and its retention has ended since;
- the runs the scheduler remembers (:mod:`redis_lease.fleet.loss.tick_memory`), which is how
  runs are found after a wipe or an older copy, when the server itself has no trace; a memory
  another scheduler superseded is not used, and one in doubt names what it remembers
  lost (``was`` unknown), never making it again.

Each one found is recorded and counted once (:mod:`redis_lease.fleet.loss.lost_records`). A run that
was open is made again (a ``rerun`` decision) when the job's schedule fires on its date and
the catch-up policy covers it now (:func:`rerun_deadline`): its record says ``after_loss``
(why) and, once planned, ``replanned_items``; the planner makes its items again and their
effects go out under the same idempotency keys, so a provider that honours them applies
nothing twice. Any other lost run (it had ended, or its date is not covered) is dropped
from the open runs and named (a ``lost`` decision) with what to do. After a loss of the
data set, each open run that survived records it (``after_loss``, a ``loss`` decision).

Every step is safe to fail and to repeat. A run to be made again is recorded lost first, as
being made again (:data:`MADE_AGAIN`, no ``rerun_at_ms`` yet): a tick that stops before the
run exists leaves that record, and the next tick goes on making it; one that stops after
completes the run's bookkeeping and marks the record. A named run's record comes first too,
then its removal from the job's open runs, redone while it is listed there. A named run's
date counts as one that had its run: the tick does not create it by itself.

Ad-hoc runs (no job) are looked for by :func:`scan_index`, once a tick, among the newest
:data:`RUN_INDEX_SCAN` of the run index and the ad-hoc runs the scheduler remembers; they
are named lost, never made again: only whoever made them can.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import date, datetime, time, timedelta
from typing import Any

from croniter import croniter

from ...limits import DAY_MS, DEFAULT_RETENTION_DAYS, RUN_LOG_CAP
from ...protocol.connection.clients import as_text
from ...protocol.store.lease_store import LeaseStore
from ..jobs.job import Job, business_date
from ..runs.job_tallies import counted_runs_key
from ..runs.lifecycle import Decision, Runs, to_ms
from . import data_set_mark, lost_records
from .data_set_mark import Observation
from .lost_records import LostRun
from .tick_memory import CREATING, DOUBTFUL, ENDING, OPEN, recall

#: The most days back a tick whose memory is in doubt names runs and dates lost (a year).
IN_DOUBT_DAYS = 366

#: The newest entries of the run index looked at for lost ad-hoc runs, each tick.
RUN_INDEX_SCAN = 500
#: What a lost run's record says was done about it when the tick made it again.
MADE_AGAIN = "made again by the tick"


@dataclass(frozen=True)
class _Candidate:
    """A run something shows existed: when it was made (ms, 0 unknown), what shows it, and
    what the scheduler remembers of it (a state of :mod:`redis_lease.fleet.loss.tick_memory`)."""

    created_ms: int
    why: str
    state: str = OPEN
    listed_open: bool = False


def recover(
    store: LeaseStore, runs: Runs, path: str, job: Job, now: datetime, seen: Observation
) -> list[Decision]:
    """Makes again or names one job's lost runs, and marks its open runs after a data-set loss.

    The tick reports the loss itself (a ``data_lost`` decision)."""
    now_ms = to_ms(now)
    decisions: list[Decision] = []
    candidates = _job_candidates(store, job, now_ms, seen)
    recorded = lost_records.of_job(store, job.name)
    for run_id, lost in recorded.items():  # begun to be made again, by any scheduler
        if lost.todo == MADE_AGAIN and not lost.rerun_at_ms and run_id not in candidates:
            candidates[run_id] = _Candidate(lost.created_at_ms, lost.why)
    for run_id in _without_record(store, list(candidates)):
        found = _lost(store, job.name, run_id, candidates[run_id], now_ms, seen)
        if found is not None:
            decisions.append(_made_again_or_named(store, runs, path, job, found, now, seen))
        elif run_id in recorded and candidates[run_id].listed_open:
            _drop_named(store, recorded[run_id], job.options.retention_days)  # a tick stopped
    _finish_made_again(store, runs, job, recorded, now)
    decisions += _tell_open_runs(store, runs, job, seen, now_ms)
    lost_records.forget_old(store, job.name, now_ms)
    return decisions


def remember_open(store: LeaseStore, runs: Runs, job: Job) -> None:
    """Remembers the job's open runs in the scheduler's memory, with when each was made,
    and the last scheduled time its ticks handled."""
    open_runs = runs.open_runs(job.name)
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        for run_id in open_runs:
            pipe.zscore(store.keys.runs, run_id)
        pipe.hget(store.keys.job(job.name), "last_fire_at")
        *scores, fired = pipe.execute()
    made = {run: int(score or 0) for run, score in zip(open_runs, scores, strict=True)}
    data_set_mark.remember_runs(store, job.name, made, int(fired) if fired else None)


def rerun_deadline(job: Job, day: date, now: datetime) -> datetime | None:
    """The deadline a lost run of ``day`` gets when made again now, or None when the job's
    schedule does not fire on ``day`` (by now) or its catch-up policy does not cover it.

    Covered: a run still on time (within ``catch_up_grace_seconds`` of its scheduled time, or before
    its deadline) whatever the policy; with ``all`` any within ``catch_up_days``; with
    ``latest`` the newest scheduled date. A run still before its deadline keeps it; a late
    one gets its full window from now, as a late catch-up does.
    """
    opts = job.options
    day_end = datetime.combine(day + timedelta(days=1), time(0), job.zone)
    fire = _latest_fire(job, min(now, day_end - timedelta(seconds=1)))
    if fire is None or business_date(job, fire) != day:
        return None
    due = job.deadline_for(day, fire)
    on_time = now - fire <= timedelta(seconds=opts.catch_up_grace_seconds) or due > now
    newest = _latest_fire(job, now)
    covered = (
        on_time
        or (opts.catch_up == "all" and fire > now - timedelta(days=opts.catch_up_days))
        or (opts.catch_up == "latest" and newest is not None and business_date(job, newest) == day)
    )
    if not covered:
        return None
    return due if due > now else now + (due - fire)


def scan_index(store: LeaseStore, runs: Runs, now: datetime) -> list[Decision]:
    """Names the lost ad-hoc runs (runs of no job the tick knows) among the newest of the
    run index and those the scheduler remembers; remembers the ad-hoc runs that exist."""
    now_ms = to_ms(now)
    memory = recall(store)
    remembered = memory.runs_of("") if memory is not None else {}
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.smembers(store.keys.jobs)
        pipe.zrevrange(store.keys.runs, 0, RUN_INDEX_SCAN - 1, withscores=True)
        jobs_raw, newest = pipe.execute()
    jobs = {as_text(name) for name in jobs_raw}
    since = now_ms - DEFAULT_RETENTION_DAYS * DAY_MS  # older ones may have ended and expired
    listed = {
        as_text(run): int(made)
        for run, made in newest
        if _job_of(as_text(run)) not in jobs and made > since
    }
    candidates = {run: _Candidate(made, "the run index lists it") for run, made in listed.items()}
    for run, made in remembered.items():
        candidates[run] = _Candidate(made, "the tick side remembered it")
    missing = _without_record(store, list(candidates))
    decisions = []
    for run_id in missing:
        found = _lost(store, "", run_id, candidates[run_id], now_ms, None)
        if found is not None:
            decisions.append(_name(store, runs, found, DEFAULT_RETENTION_DAYS))
    existing = {run: made for run, made in listed.items() if run not in missing}
    if memory is not None:
        data_set_mark.remember_runs(store, "", existing)
    return decisions


# -- finding ----------------------------------------------------------------------------


def _job_of(run_id: str) -> str:
    """The job part of a run id (``<job>:<date>``), or "" for an id with no ``:``."""
    return run_id.split(":", 1)[0] if ":" in run_id else ""


def _job_candidates(
    store: LeaseStore, job: Job, now_ms: int, seen: Observation
) -> dict[str, _Candidate]:
    """The job's runs something shows existed: remembered by the scheduler (as far as its
    memory may be used), dated within its retention, listed open."""
    since = now_ms - job.options.retention_days * DAY_MS
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.smembers(store.keys.job_open_runs(job.name))
        pipe.zrangebyscore(
            store.keys.job_dates(job.name), f"({max(since, 0)}", "+inf", withscores=True
        )
        listed_open, dated = pipe.execute()
    found: dict[str, _Candidate] = {}
    memory = seen.remembered
    for run_id, made in (memory.runs_of(job.name) if memory else {}).items():
        state = memory.state_of(run_id) if memory else OPEN
        if state in (CREATING, DOUBTFUL) and memory and job.name not in memory.unsettled:
            continue  # with no loss left to handle, the server's records are the truth
        if state == DOUBTFUL and 0 < made <= now_ms - IN_DOUBT_DAYS * DAY_MS:
            continue  # a memory that old is of no use: named only within a year
        found[run_id] = _Candidate(made, _REMEMBERED[state], state)
    for day, made in dated:
        run_id = job.run_id(date.fromisoformat(as_text(day)))
        if run_id not in found or found[run_id].state == DOUBTFUL:
            found[run_id] = _Candidate(
                int(made), "the job's dates list it, made within its retention"
            )
    for raw in listed_open:
        run_id = as_text(raw)
        known = found.get(run_id)
        made = known.created_ms if known else 0
        state = ENDING if known and known.state == ENDING else OPEN
        found[run_id] = _Candidate(made, "it is listed among the job's open runs", state, True)
    return found


#: What a remembered run's candidate says of it, by its state.
_REMEMBERED = {
    OPEN: "the tick side remembered it open",
    CREATING: "the tick side remembered making it",
    ENDING: "the tick side remembered ending it",
    DOUBTFUL: "a tick side remembered it, but another had ticked since",
}


def _without_record(store: LeaseStore, run_ids: list[str]) -> list[str]:
    """The runs of ``run_ids`` that have no record (one round trip)."""
    having = set(_with_record(store, run_ids))
    return [run_id for run_id in run_ids if run_id not in having]


def _with_record(store: LeaseStore, run_ids: list[str]) -> list[str]:
    """The runs of ``run_ids`` that have a record (one round trip)."""
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        for run_id in run_ids:
            pipe.exists(store.keys.run(run_id))
        found = pipe.execute() if run_ids else []
    return [run_id for run_id, exists in zip(run_ids, found, strict=True) if exists]


def _counted_end(store: LeaseStore, job: str, run_id: str) -> int | None:
    """Until when (ms) the counted end of ``run_id`` is kept (its retention and a day), or
    None when no end of it is counted (:mod:`redis_lease.fleet.runs.job_tallies`)."""
    pattern = "".join(f"\\{c}" if c in "*?[]\\" else c for c in run_id) + "@*"
    with store.translating_errors(run_id):
        kept = [
            int(score)
            for _, score in store.client.zscan_iter(counted_runs_key(store, job), match=pattern)
        ]
    return max(kept) if kept else None


def _lost(
    store: LeaseStore,
    job: str,
    run_id: str,
    candidate: _Candidate,
    now_ms: int,
    seen: Observation | None,
) -> LostRun | None:
    """The record of ``run_id`` (no record on the server) as a lost run, or None when it is
    named lost already or its absence is its retention ending. A run a tick began to make
    again, and did not finish making, is returned as recorded then: it is made again now."""
    named = lost_records.read(store, run_id)
    if named is not None and not named.rerun_at_ms:
        return named if named.todo == MADE_AGAIN else None
    kept_until = _counted_end(store, job, run_id)
    if kept_until is not None and now_ms >= kept_until - DAY_MS:
        return None  # it ended and its retention is over: expired, not lost
    if kept_until is not None:
        was = "final"
    elif candidate.state in (ENDING, DOUBTFUL):
        was = "unknown"  # it may have ended: never made again
    else:
        was = "open"
    why = candidate.why
    if seen is not None and seen.since_loss:
        why += "; after a loss of the data set"
    day = run_id.split(":", 1)[1] if job else ""
    return LostRun(run_id, job, day, candidate.created_ms, now_ms, was, why, "")


# -- acting -----------------------------------------------------------------------------


def _made_again_or_named(
    store: LeaseStore,
    runs: Runs,
    path: str,
    job: Job,
    lost: LostRun,
    now: datetime,
    seen: Observation,
) -> Decision:
    """Makes a lost run of ``job`` again when it was open and its date is covered, else
    names it."""
    day = date.fromisoformat(lost.business_date)
    deadline = rerun_deadline(job, day, now) if lost.was == "open" else None
    if deadline is None:
        named = replace(lost, todo=_todo(lost, job, path, day))
        return _name(store, runs, named, job.options.retention_days)
    # Recorded first, as being made again: a tick that stops before the run exists leaves a
    # record the next tick finds and goes on from (:func:`_lost`), never one that reads named.
    lost_records.record(store, replace(lost, todo=MADE_AGAIN))
    fields = {
        "after_loss": lost.why,
        "after_loss_at": str(lost.noticed_at_ms),
        "after_loss_epoch": str(seen.epoch),
        "replanned_items": "0",
    }
    run_id, created = runs.ensure(job, day, now, deadline, fields=fields)
    lost_records.mark_rerun(store, job.name, run_id, to_ms(now))
    if not created:  # made again meanwhile
        return Decision("rerun", run_id, "made again meanwhile")
    reason = (
        f"re-run after a loss: {lost.why}; planned again from the planner, effects sent "
        "again under the same idempotency keys"
    )
    return runs.record_decision(run_id, "rerun", reason)


def name_unknown_dates(
    store: LeaseStore, runs: Runs, path: str, job: Job, days: list[date], now: datetime, why: str
) -> list[Decision]:
    """Names lost the runs of ``days`` that have no record, each one that may have run
    (``was`` unknown): after a loss, a scheduler whose memory is in doubt cannot tell whether
    another ran them, so it makes none of them (:mod:`redis_lease.fleet.tick.due_runs`)."""
    now_ms = to_ms(now)
    run_ids = [job.run_id(day) for day in days]
    decisions = []
    for run_id, day in zip(run_ids, days, strict=True):
        if run_id not in _without_record(store, [run_id]):
            continue
        if lost_records.read(store, run_id) is not None:
            continue  # named already, or being made again
        lost = LostRun(run_id, job.name, day.isoformat(), 0, now_ms, "unknown", why, "")
        named = replace(lost, todo=_todo(lost, job, path, day))
        decisions.append(_name(store, runs, named, job.options.retention_days))
    return decisions


def _todo(lost: LostRun, job: Job, path: str, day: date) -> str:
    """What to do about a lost run of ``job`` the tick does not make again."""
    scheduled = job.scheduled_start(day)
    again = (
        f"redis-lease backfill {path} --from {day} --to {day}"
        if business_date(job, scheduled) == day
        else f"redis-lease start {path} --date {day}"
    )
    if lost.was == "final":
        return f"it had ended, so it is not run again; to run it anyway: {again}"
    if lost.was == "unknown":
        return (
            "it may have ended (the tick side's memory of it is not current), so it is not "
            f"run again; check its effects at the provider, then, to run it: {again}"
        )
    return (
        f"not run again: the job's schedule and catch-up policy ({job.options.catch_up}) do "
        f"not cover {day} now; to run it: {again}"
    )


#: What to do about a lost ad-hoc run.
ADHOC_TODO = (
    "nothing makes an ad-hoc run again by itself: add its items again (redis-lease add "
    "{run} ...); their effects go out under the same idempotency keys"
)


def _name(store: LeaseStore, runs: Runs, lost: LostRun, retention_days: int) -> Decision:
    """Records a lost run that is not made again, drops it from its job's open runs, keeps it
    in the run index (so listings show it lost) and notes it in its event log."""
    if not lost.todo:
        lost = replace(lost, todo=ADHOC_TODO.format(run=lost.run_id))
    lost_records.record(store, lost)  # first: a tick that stops after it redoes the rest
    return _drop_named(store, lost, retention_days)


def _drop_named(store: LeaseStore, lost: LostRun, retention_days: int = 0) -> Decision:
    """What naming a lost run does after its record: drops it from its job's open runs,
    keeps it in the run index, notes it in its event log. Safe to repeat."""
    reason = f"lost: {lost.describe()}"
    events = store.keys.run_events(lost.run_id)
    days = retention_days or DEFAULT_RETENTION_DAYS
    with store.translating_errors(lost.run_id):
        pipe = store.client.pipeline(transaction=False)
        if lost.job:
            pipe.srem(store.keys.job_open_runs(lost.job), lost.run_id)
            # its date had a run: no tick creates it again by itself (a backfill does)
            dated = {lost.business_date: lost.created_at_ms}
            pipe.zadd(store.keys.job_dates(lost.job), dated, nx=True)
        if lost.created_at_ms:
            pipe.zadd(store.keys.runs, {lost.run_id: lost.created_at_ms}, nx=True)
        pipe.xadd(events, {"kind": "lost", "reason": reason}, maxlen=RUN_LOG_CAP, approximate=True)
        pipe.pexpire(events, days * DAY_MS)
        pipe.execute()
    return Decision("lost", lost.run_id, reason)


def _finish_made_again(
    store: LeaseStore, runs: Runs, job: Job, recorded: dict[str, LostRun], now: datetime
) -> None:
    """Finishes what a tick that stopped midway left of making lost runs again: a run that
    exists again but whose record does not say so yet gets its bookkeeping completed (its
    date, the job's open runs) and its record marked made again. Safe to repeat."""
    making = [
        lost for lost in recorded.values() if lost.todo == MADE_AGAIN and not lost.rerun_at_ms
    ]
    exist = set(making and _with_record(store, [lost.run_id for lost in making]))
    for lost in making:
        if lost.run_id in exist and lost_records.read(store, lost.run_id) == lost:
            runs.ensure(job, date.fromisoformat(lost.business_date), now)
            lost_records.mark_rerun(store, job.name, lost.run_id, to_ms(now))


def _tell_open_runs(
    store: LeaseStore, runs: Runs, job: Job, seen: Observation, now_ms: int
) -> list[Decision]:
    """Records on each open run that lived through a loss of the data set (made before the
    last loss was noticed) that loss, once per loss (its ``after_loss_epoch``). Looked for on
    every tick after a loss, so a tick that stopped midway is finished by the next."""
    if not seen.epoch:
        return []  # no loss in this data set's life
    open_runs = runs.open_runs(job.name)
    if not open_runs:
        return []
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        for run_id in open_runs:
            pipe.hmget(store.keys.run(run_id), ["state", "after_loss_epoch", "created_at"])
        pipe.hmget(store.keys.data_set, ["last_loss_at", "last_loss_reason"])
        *replies, (loss_at, last_reason) = pipe.execute()
    reason = seen.loss.reason if seen.loss else as_text(last_reason or "a loss was noticed")
    noticed_ms = int(loss_at or 0)
    decisions = []
    for run_id, (state, epoch, created) in zip(open_runs, replies, strict=True):
        told = epoch is not None and int(epoch) >= seen.epoch
        if state is None or told or int(created or 0) >= noticed_ms:
            continue
        fields: dict[Any, Any] = {
            "after_loss": reason,
            "after_loss_at": str(now_ms),
            "after_loss_epoch": str(seen.epoch),
        }
        store.set_after_loss(run_id)  # first: an effect with no record may have been applied
        with store.translating_errors(run_id):
            store.client.hset(store.keys.run(run_id), mapping=fields)
        text = (
            f"a loss of data during this run: {reason}; items whose work was lost are worked "
            "again, effects under the same idempotency keys"
        )
        decisions.append(runs.record_decision(run_id, "loss", text))
    return decisions


def _latest_fire(job: Job, until: datetime) -> datetime | None:
    """The job's latest scheduled time at or before ``until``."""
    fire: datetime = croniter(
        job.options.schedule, until.astimezone(job.zone) + timedelta(seconds=1)
    ).get_prev(datetime)
    while fire > until:
        fire = croniter(job.options.schedule, fire).get_prev(datetime)
    return fire


__all__ = [
    "MADE_AGAIN",
    "RUN_INDEX_SCAN",
    "name_unknown_dates",
    "recover",
    "remember_open",
    "rerun_deadline",
    "scan_index",
]
