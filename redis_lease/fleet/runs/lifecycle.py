"""Runs of a job: creation, planning, state changes, the decision log, finalizing."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from ...errors import InvalidInput, NotFound, PlanningDeferred
from ...limits import RUN_LOG_CAP, TEXT_MAX_BYTES
from ...messages import one_line
from ...protocol.connection.clients import as_text, server_ms
from ...protocol.leases import Item, from_ms
from ...protocol.replies import Transition
from ...protocol.store.lease_store import LeaseStore
from ...protocol.store.store_client import lock
from ...protocol.validation import check_id, clip, encode_json
from ..loss import lost_records, tick_memory
from . import job_tallies
from .run_states import (
    CANCELABLE_STATES,
    CANCELED,
    FAILED,
    FINAL_STATES,
    OPEN_STATES,
    PLANNING,
    RESUMABLE_STATES,
    RUNNING,
    accounting,
    final_state,
    not_resumable,
    reopen,
    retention_days,
    retire,
)

if TYPE_CHECKING:  # views of runs need neither a job nor croniter
    from ..jobs.job import Job, Planner

PLAN_BATCH = 500
PLANNER_LOCK_MS = 120_000
#: A transient planner error's back-off: the first wait, doubled each time up to the most.
PLAN_RETRY_FIRST_MS = 10_000
PLAN_RETRY_MAX_MS = 300_000
#: Told the items planned so far, each batch (see :meth:`Runs.plan`).
PlanProgress = Callable[[int], None]


def to_ms(moment: datetime) -> int:
    """An aware datetime as epoch milliseconds."""
    return int(moment.timestamp() * 1000)


@dataclass(frozen=True)
class Decision:
    """Something a tick or an operator decided, with its reason."""

    kind: str
    run_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.kind} {self.run_id}: {self.reason}"


class Runs:
    """Run-level operations on one store."""

    def __init__(self, store: LeaseStore) -> None:
        self.store = store
        self.keys = store.keys
        self.client = store.client

    def server_now(self) -> datetime:
        """The Redis server's clock."""
        with self.store.translating_errors():
            return from_ms(server_ms(self.client))

    def info(self, run_id: str) -> dict[str, str]:
        """The run's record; raises NotFound."""
        with self.store.translating_errors(run_id):
            raw = self.client.hgetall(self.keys.run(run_id))
        if not raw:
            raise NotFound.run(run_id)
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def record_decision(self, run_id: str, kind: str, reason: str, **fields: Any) -> Decision:
        """Appends a decision to the run's decision log (its ``events`` stream)."""
        entry = {"kind": kind, "reason": reason, **{k: str(v) for k, v in fields.items()}}
        with self.store.translating_errors(run_id):
            events = self.keys.run_events(run_id)
            self.client.xadd(events, entry, maxlen=RUN_LOG_CAP, approximate=True)  # type: ignore[arg-type]
        return Decision(kind, run_id, reason)

    def decisions(self, run_id: str, count: int = 20) -> list[dict[str, str]]:
        """The newest decisions of a run, oldest first."""
        with self.store.translating_errors(run_id):
            rows = self.client.xrevrange(self.keys.run_events(run_id), count=count) or []
        events = []
        for entry_id, fields in reversed(rows):
            event = {as_text(k): as_text(v) for k, v in (fields or {}).items()}
            event.setdefault("at", as_text(entry_id).split("-")[0])
            events.append(event)
        return events

    def transition(
        self, run_id: str, expected: tuple[str, ...] | str, to: str, reason: str, **fields: Any
    ) -> bool:
        """Moves the run to ``to`` if it is in an expected state; True when it changed."""
        return self._transition(run_id, expected, to, reason, **fields).changed

    def _transition(
        self, run_id: str, expected: tuple[str, ...] | str, to: str, reason: str, **fields: Any
    ) -> Transition:
        """:meth:`transition`, with the script's reply (its ``now_ms`` is the new ``state_at``)."""
        allowed = expected if isinstance(expected, str) else ",".join(expected)
        extra = [clip(str(part), TEXT_MAX_BYTES) for pair in fields.items() for part in pair]
        keys = [self.keys.run(run_id), self.keys.run_events(run_id)]
        with self.store.translating_errors(run_id):
            transition: Transition = self.store.scripts.call(
                "run_transition", keys, [allowed, to, clip(reason, TEXT_MAX_BYTES), *extra]
            )
        return transition

    # -- job runs -------------------------------------------------------------

    def ensure(
        self,
        job: Job,
        business_date: date,
        started: datetime,
        deadline: datetime | None = None,
        fields: dict[str, str] | None = None,
    ) -> tuple[str, bool]:
        """Creates the job's run for a business date once; returns (run id, created now).

        ``deadline`` defaults to the job's deadline for the date; ``fields`` are stored
        with a run created now (a re-run's ``after_loss``; a run recorded lost gets one
        whoever makes it again). Repeating the call after a crash midway completes the
        bookkeeping of an open run. A run recorded lost and created again is noted so
        (:func:`redis_lease.fleet.loss.lost_records.mark_rerun`).
        """
        run_id = job.run_id(business_date)
        deadline = deadline or job.deadline_for(business_date, started)
        fields = fields if fields and "after_loss" in fields else self._doubt(run_id, fields)
        # Remembered before it exists: the scheduler still detects a loss right after.
        tick_memory.note(self.store, job.name, run_id, tick_memory.CREATING, to_ms(started))
        created, _ = self.store.create_run(
            run_id,
            job.options.shards,
            state=PLANNING,
            fields={
                "job": job.name,
                "business_date": business_date.isoformat(),
                "deadline_at": str(to_ms(deadline)),
                "planned": "0",
                "retention_days": str(job.options.retention_days),
                **(fields or {}),
            },
        )
        still_open = created or self.info(run_id)["state"] in OPEN_STATES
        with self.store.translating_errors(run_id):
            pipe = self.client.pipeline(transaction=False)
            dates = self.keys.job_dates(job.name)
            pipe.zadd(dates, {business_date.isoformat(): to_ms(started)}, nx=True)
            if still_open:
                pipe.sadd(self.keys.job_open_runs(job.name), run_id)
            pipe.execute()
        if created:
            lost_records.mark_rerun(self.store, job.name, run_id, to_ms(started))
            self.record_decision(
                run_id, "created", f"run for {business_date} due {deadline.isoformat()}"
            )
        return run_id, created

    def _doubt(self, run_id: str, fields: dict[str, str] | None) -> dict[str, str] | None:
        """``fields``, with ``after_loss`` when ``run_id`` was recorded lost.

        A run made with a lost run's id is as careful with its effects as one the tick makes
        again, whoever makes it (the tick, a backfill, ``start``): their ledger may have gone
        with the lost run."""
        lost = lost_records.read(self.store, run_id)
        if lost is None:
            return fields
        noted = {
            "after_loss": f"its run was lost before: {lost.why}",
            "after_loss_at": str(lost.noticed_at_ms),
            "replanned_items": "0",
        }
        return {**noted, **(fields or {})}

    def plan(
        self,
        job: Job,
        run_id: str,
        progress: PlanProgress | None = None,
        now_ms: int | None = None,
    ) -> int | None:
        """Streams the planner's items into the run in bounded batches.

        Safe to repeat after a crash midway: existing items are left alone. Returns
        the number of items planned, or None when another planner holds the run.
        A re-run after a loss (``after_loss`` in its record) has every shard marked
        first (:meth:`~redis_lease.LeaseStore.set_after_loss`: an effect with no
        ledger record may have been applied) and counts the items it added in
        ``replanned_items``. An error of the planner (or an item it yields
        that is not valid) fails the run with the error as its reason
        (:func:`planning_reason`), except one of the job's transient planner errors
        (``@job.planner(retry_on=...)``): it leaves the run planning with a time to plan
        again (:class:`PlanningDeferred`, before the deadline; at ``now_ms``, the tick's
        time, plus a back-off). A Redis failure leaves the run planning, for the next tick
        to plan again. ``progress`` is told the items streamed so far after each batch.
        """
        planner = job.plan_items
        if planner is None:
            raise InvalidInput(f"job {job.name!r} has no planner; decorate one with @job.planner")
        key = self.keys.run_planner(run_id)
        with lock(self.store, key, PLANNER_LOCK_MS, run_id) as taken:
            if not taken:
                return None
            info = self.info(run_id)
            business_date = date.fromisoformat(info["business_date"])
            rerun = "after_loss" in info
            if rerun:  # before its items: their effects' ledger may have gone with the loss
                self.store.set_after_loss(run_id)
            items = _Planned(planner, business_date, int(info.get("deadline_at", "0")), rerun)
            try:
                self._add_planned(job, run_id, items, key, progress)
            except job.plan_retry_on as error:
                self._defer_planning(job, run_id, info, error, now_ms)
                raise
        # Exact for distinct ids, and safe when planning repeats after a crash.
        planned = sum(counts.get("added", 0) for counts in self.store.shard_counts(run_id))
        self.transition(
            run_id,
            PLANNING,
            RUNNING,
            f"planned {planned} items",
            planned="1",
            planned_items=planned,
        )
        return planned

    def _add_planned(
        self, job: Job, run_id: str, plan: _Planned, lock: str, progress: PlanProgress | None
    ) -> None:
        """Streams the planner's items into the run; a planner error fails the run."""
        streamed = 0
        try:
            items = iter(plan.planner(plan.business_date))
        except job.plan_retry_on:
            raise  # transient: the run stays planning (plan)
        except Exception as error:  # the planner is user code: any failure fails the run
            self._fail_planning(job, run_id, error)
            raise
        while True:
            try:
                batch = list(itertools.islice(items, PLAN_BATCH))
            except job.plan_retry_on:
                raise
            except Exception as error:
                self._fail_planning(job, run_id, error)
                raise
            if not batch:
                return
            try:
                added, _ = self.store.add(
                    run_id,
                    batch,
                    max_attempts=job.options.max_attempts,
                    backoff_base=job.options.backoff_base_seconds,
                    backoff_cap=job.options.backoff_cap_seconds,
                    deadline_ms=plan.deadline_ms,
                )
            except InvalidInput as error:  # the planner yielded a bad item: name it
                named = _named_item(batch, streamed, error)
                self._fail_planning(job, run_id, named)
                raise named from None
            with self.store.translating_errors(run_id):
                pipe = self.client.pipeline(transaction=False)
                pipe.pexpire(lock, PLANNER_LOCK_MS)
                if plan.rerun:
                    pipe.hincrby(self.keys.run(run_id), "replanned_items", len(added))
                pipe.execute()
            streamed += len(batch)
            if progress is not None:
                progress(streamed)

    def _defer_planning(
        self,
        job: Job,
        run_id: str,
        info: dict[str, str],
        error: BaseException,
        now_ms: int | None,
    ) -> None:
        """A transient planner error: the run stays planning, to be planned again after a
        back-off (10 s, doubling, at most 5 minutes); when that would be past the run's
        deadline, the run fails now. Raises :class:`PlanningDeferred` when deferred."""
        attempt = int(info.get("planning_attempts", "0") or 0) + 1
        reason = planning_reason(error)
        now = server_ms(self.client) if now_ms is None else now_ms
        retry_at = now + min(PLAN_RETRY_FIRST_MS * 2 ** min(attempt - 1, 16), PLAN_RETRY_MAX_MS)
        deadline = int(info.get("deadline_at", "0") or 0)
        if deadline and retry_at >= deadline:
            times = "once" if attempt == 1 else f"{attempt} times"
            tried = f"{reason} (a transient error, tried {times} until the deadline)"
            self._fail_planning(job, run_id, error, tried)
            return
        with self.store.translating_errors(run_id):
            self.client.hset(
                self.keys.run(run_id),
                mapping={
                    "planning_attempts": attempt,
                    "planning_retry_at": retry_at,
                    "planning_error": clip(reason, TEXT_MAX_BYTES),
                },
            )
        again = from_ms(retry_at).isoformat(timespec="seconds")
        said = f"planning failed (attempt {attempt}), planned again after {again}: {reason}"
        self.record_decision(run_id, "plan_retry", said)
        raise PlanningDeferred(said, run_id=run_id) from error

    def _fail_planning(self, job: Job, run_id: str, error: BaseException, reason: str = "") -> None:
        tick_memory.note(self.store, job.name, run_id, tick_memory.ENDING)
        reason = reason or planning_reason(error)
        ended = self._transition(run_id, OPEN_STATES, FAILED, reason)
        if ended.changed:
            self._count_finished(job.name, run_id, FAILED, ended.now_ms, job.options.retention_days)
        self._retire(job.name, run_id, job.options.retention_days)

    # -- closing and reopening ------------------------------------------------

    def finalize(self, run_id: str, trigger: str) -> Decision | None:
        """Closes the run and records succeeded, partial or failed from its accounting.

        succeeded: exactly the planned items, each done by a commit before the
        deadline (a run planned with no items too); partial: some done; failed:
        none done. The reason names the trigger and the counts. The end is counted
        once in its job's ``runs_finished`` tally (:mod:`redis_lease.fleet.runs.job_tallies`): a run
        resumed and finalized again is counted again.
        """
        self.store.set_closed(run_id, True)
        status = self.store.status(run_id)
        state = final_state(status)
        reason = f"{trigger}: {accounting(status)}"
        final = json.dumps(
            {**status.counts, "planned": status.planned, "lost": status.lost, "late": status.late}
        )
        # Remembered before it ends: after a loss, a run that may have ended is not run again.
        tick_memory.note(self.store, status.info.get("job", ""), run_id, tick_memory.ENDING)
        ended = self._transition(run_id, OPEN_STATES, state, reason, final_counts=final)
        if not ended.changed:
            return None
        info = self.info(run_id)
        # Counted even when resumed in the meantime: the run did end.
        self._count_finished(info.get("job", ""), run_id, state, ended.now_ms, retention_days(info))
        if info["state"] != state:  # resumed in the meantime: keep it open
            return None
        self._retire(info.get("job", ""), run_id, retention_days(info))
        return self.record_decision(run_id, "finalize", f"{state}: {reason}")

    def retire_if_final(self, run_id: str, info: dict[str, str]) -> bool:
        """Repairs a finished run still listed as open (a crash after its last change):
        counts its end (once: the end is known by its ``state_at``) and retires it."""
        if info.get("state") not in FINAL_STATES:
            return False
        ended_ms = int(info["state_at"]) if info.get("state_at", "").isdigit() else 0
        job, days = info.get("job", ""), retention_days(info)
        self._count_finished(job, run_id, info["state"], ended_ms, days)
        self._retire(job, run_id, days)
        return True

    def _count_finished(
        self, job_name: str, run_id: str, state: str, ended_ms: int, retention: int
    ) -> None:
        """Counts the run's end in its job's finished tally; before it is retired, so that
        a crash between the two is repaired by the next tick (:meth:`retire_if_final`)."""
        job_tallies.count_finished(self.store, job_name, run_id, state, ended_ms, retention)

    def gone(self, run_id: str) -> NotFound | None:
        """The error for a run with no record when something shows it existed, else None
        (:func:`redis_lease.fleet.loss.lost_records.gone`)."""
        return lost_records.gone(self.store, run_id)

    def _retire(self, job_name: str, run_id: str, retention_days: int) -> None:
        """Drops the run from its job's open runs and lets its keys expire."""
        retire(self.store, job_name, run_id, retention_days)

    def resume(self, run_id: str, deadline: datetime | None = None) -> Decision:
        """Reopens a partial or failed run (optionally with a new deadline); a canceled
        run is final (:data:`~redis_lease.fleet.runs.run_states.RESUMABLE_STATES`).

        An operator's explicit act: it lifts the deadline bar on every shard, so
        claims are granted again until the (new) deadline, and records that it did.
        """
        info = self.info(run_id)
        refused = not_resumable(run_id, info)
        if refused is not None:
            raise InvalidInput(refused, run_id=run_id)
        until_ms = to_ms(deadline) if deadline is not None else int(info.get("deadline_at", "0"))
        if until_ms <= to_ms(self.server_now()):
            if deadline is not None:
                raise InvalidInput(
                    f"deadline {deadline.isoformat()} is in the past; pass a later one"
                )
            raise InvalidInput(
                f"run {run_id!r} is past its deadline; resume it with a new deadline"
            )
        reason = (
            "resumed by an operator; deadline bar lifted: claims allowed until "
            f"{from_ms(until_ms).isoformat(timespec='seconds')}"
        )
        # A run whose plan never completed goes back to planning (re-planning adds what is missing).
        state = RUNNING if info.get("planned", "1") == "1" else PLANNING
        # The shards first, the run's state last: a failure midway leaves the run as it
        # was (partial or failed), so resuming again finishes the job.
        self.store.set_deadline(run_id, until_ms)
        self.store.set_closed(run_id, False)
        reopen(self.store, info.get("job", ""), run_id)
        self.transition(run_id, RESUMABLE_STATES, state, reason, deadline_at=until_ms)
        return self.record_decision(run_id, "resume", reason)

    def cancel(self, run_id: str, reason: str = "canceled by an operator") -> bool:
        """Closes an open run as canceled."""
        self.store.set_closed(run_id, True)
        info = self.info(run_id)
        tick_memory.note(self.store, info.get("job", ""), run_id, tick_memory.ENDING)
        ended = self._transition(run_id, CANCELABLE_STATES, CANCELED, reason)
        if ended.changed:
            job, days = info.get("job", ""), retention_days(info)
            self._count_finished(job, run_id, CANCELED, ended.now_ms, days)
            self._retire(job, run_id, days)
            self.record_decision(run_id, "cancel", reason)
        return ended.changed

    def open_runs(self, job_name: str) -> list[str]:
        """The job's open runs (planning or running)."""
        with self.store.translating_errors():
            return sorted(
                as_text(r) for r in self.client.smembers(self.keys.job_open_runs(job_name))
            )


def planned_item(item: Any, position: int) -> None:
    """Checks the ``position``-th item a planner yielded (from 1) as adding will: an
    :class:`Item` with a valid id and a payload JSON can hold; else InvalidInput naming it."""
    if not isinstance(item, Item):
        shown = clip(repr(item), 80)
        raise InvalidInput(
            f"the planner's item {position} is a {type(item).__name__} ({shown}), not a "
            "redis_lease.Item: yield Item(id, payload)"
        )
    try:
        check_id(item.id, "item id")
        encode_json(item.payload)
    except InvalidInput as error:
        raise InvalidInput(f"the planner's item {position}: {error}") from None


def _named_item(batch: list[Any], streamed: int, error: InvalidInput) -> InvalidInput:
    """The refusal of the first bad item of ``batch`` (after ``streamed`` items), named by
    its position in the plan (:func:`planned_item`); ``error`` when no item is to blame.
    Checked only once adding refused the batch: a plan's items are checked once."""
    for position, item in enumerate(batch, streamed + 1):
        try:
            planned_item(item, position)
        except InvalidInput as named:
            return named
    return error


def planning_reason(error: BaseException) -> str:
    """Why planning failed a run, one rule for every planner error: what the planner
    yielded that was wrong (with its position), or what it raised, with its own message."""
    if isinstance(error, InvalidInput):
        return f"planning error: {error}"
    return f"planning error: the planner raised {type(error).__name__}: {one_line(str(error))}"


@dataclass(frozen=True)
class _Planned:
    """What planning streams: the planner, its business date, the run's deadline (ms), and
    whether the run is a re-run after a loss (its added items are counted)."""

    planner: Planner
    business_date: date
    deadline_ms: int
    rerun: bool = False


__all__ = [
    "FINAL_STATES",
    "OPEN_STATES",
    "Decision",
    "Item",
    "Runs",
    "accounting",
    "final_state",
]
