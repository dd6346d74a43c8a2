"""Runs of a job: creation, planning, state changes, the decision log, finalizing."""

from __future__ import annotations

import contextlib
import itertools
import json
import uuid
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

import redis

from .connection import as_text
from .errors import InvalidInput, NotFound
from .jobs import Job
from .lease import Item, from_ms
from .store import LeaseStore

OPEN_STATES = ("planning", "running")
FINAL_STATES = ("succeeded", "partial", "failed", "canceled")
PLAN_BATCH = 500
PLANNER_LOCK_MS = 120_000


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
        with self.store.errors():
            seconds, micros = self.client.time()
        return from_ms(seconds * 1000 + micros // 1000)

    def info(self, run_id: str) -> dict[str, str]:
        """The run's record; raises NotFound."""
        with self.store.errors(run_id):
            raw = self.client.hgetall(self.keys.run(run_id))
        if not raw:
            raise NotFound(f"run {run_id!r} not found", run_id=run_id)
        return {as_text(k): as_text(v) for k, v in raw.items()}

    def event(self, run_id: str, kind: str, reason: str, **fields: Any) -> Decision:
        """Appends a decision to the run's event log."""
        entry = {"kind": kind, "reason": reason, **{k: str(v) for k, v in fields.items()}}
        with self.store.errors(run_id):
            self.client.xadd(self.keys.run_events(run_id), entry, maxlen=1000, approximate=True)  # type: ignore[arg-type]
        return Decision(kind, run_id, reason)

    def events(self, run_id: str, count: int = 20) -> list[dict[str, str]]:
        """The newest decisions of a run, oldest first."""
        with self.store.errors(run_id):
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
        allowed = expected if isinstance(expected, str) else ",".join(expected)
        extra = [str(part) for pair in fields.items() for part in pair]
        keys = [self.keys.run(run_id), self.keys.run_events(run_id)]
        with self.store.errors(run_id):
            changed, _previous, _now = self.store.scripts.run(
                "run_transition", keys, [allowed, to, reason, *extra]
            )
        return bool(changed)

    # -- job runs -------------------------------------------------------------

    def ensure(
        self,
        job: Job,
        business_date: date,
        started: datetime,
        deadline: datetime | None = None,
    ) -> tuple[str, bool]:
        """Creates the job's run for a business date once; returns (run id, created now).

        ``deadline`` defaults to the job's deadline for the date. Repeating the call
        after a crash midway completes the bookkeeping of an open run.
        """
        run_id = job.run_id(business_date)
        deadline = deadline or job.deadline_for(business_date, started)
        created, _ = self.store.create_run(
            run_id,
            job.options.shards,
            state="planning",
            fields={
                "job": job.name,
                "business_date": business_date.isoformat(),
                "deadline_at": str(to_ms(deadline)),
                "planned": "0",
                "retention_days": str(job.options.retention_days),
            },
        )
        still_open = created or self.info(run_id)["state"] in OPEN_STATES
        with self.store.errors(run_id):
            pipe = self.client.pipeline(transaction=False)
            dates = self.keys.job_dates(job.name)
            pipe.zadd(dates, {business_date.isoformat(): to_ms(started)}, nx=True)
            if still_open:
                pipe.sadd(self.keys.job_open_runs(job.name), run_id)
            pipe.execute()
        if created:
            self.event(run_id, "created", f"run for {business_date} due {deadline.isoformat()}")
        return run_id, created

    def plan(self, job: Job, run_id: str) -> int | None:
        """Streams the planner's items into the run in bounded batches.

        Safe to repeat after a crash midway: existing items are left alone. Returns
        the number of items planned, or None when another planner holds the run.
        An error of the planner (or an item it yields that is not valid) fails the
        run with the error as its reason; a Redis failure leaves the run planning,
        for the next tick to plan again.
        """
        if job.plan_items is None:
            raise InvalidInput(f"job {job.name!r} has no planner; decorate one with @job.planner")
        lock = self.keys.run_planner(run_id)
        owner = uuid.uuid4().hex
        with self.store.errors(run_id):
            if not self.client.set(lock, owner, nx=True, px=PLANNER_LOCK_MS):
                return None
        business_date = date.fromisoformat(self.info(run_id)["business_date"])
        total = 0
        try:
            try:
                items = iter(job.plan_items(business_date))
            except Exception as error:  # the planner is user code: any failure fails the run
                self._fail_planning(job, run_id, error)
                raise
            while True:
                try:
                    batch = list(itertools.islice(items, PLAN_BATCH))
                except Exception as error:
                    self._fail_planning(job, run_id, error)
                    raise
                if not batch:
                    break
                try:
                    self.store.add(
                        run_id,
                        batch,
                        max_attempts=job.options.max_attempts,
                        backoff_base=job.options.backoff_base,
                        backoff_cap=job.options.backoff_cap,
                    )
                except InvalidInput as error:  # the planner yielded a bad item
                    self._fail_planning(job, run_id, error)
                    raise
                total += len(batch)
                self.client.pexpire(lock, PLANNER_LOCK_MS)
        finally:
            with contextlib.suppress(redis.RedisError):
                self.store.scripts.run("release_lock", [lock], [owner])
        self.transition(
            run_id, "planning", "running", f"planned {total} items", planned="1", items=total
        )
        return total

    def _fail_planning(self, job: Job, run_id: str, error: Exception) -> None:
        self.transition(run_id, OPEN_STATES, "failed", f"planning error: {error!r}")
        self._retire(job.name, run_id, job.options.retention_days)

    # -- closing and reopening ------------------------------------------------

    def finalize(self, run_id: str, reason: str) -> Decision | None:
        """Closes the run and records succeeded, partial or failed from its counts.

        succeeded: every item done (a run planned with no items too); partial: some
        done; failed: none done.
        """
        self.store.set_closed(run_id, True)
        status = self.store.status(run_id)
        counts = status.counts
        if counts["done"] == status.total:
            state = "succeeded"
        elif counts["done"] > 0:
            state = "partial"
        else:
            state = "failed"
        summary = ", ".join(f"{n} {s}" for s, n in counts.items())
        full_reason = f"{reason}: {summary}"
        changed = self.transition(
            run_id, OPEN_STATES, state, full_reason, final_counts=json.dumps(counts)
        )
        if not changed:
            return None
        info = self.info(run_id)
        if info["state"] != state:  # resumed in the meantime: keep it open
            return None
        self._retire(info.get("job", ""), run_id, int(info.get("retention_days", "14")))
        return self.event(run_id, "finalize", f"{state}: {full_reason}")

    def _retire(self, job_name: str, run_id: str, retention_days: int) -> None:
        """Drops the run from its job's open runs and lets its keys expire."""
        ttl_ms = retention_days * 86_400_000
        with self.store.errors(run_id):
            pipe = self.client.pipeline(transaction=False)
            if job_name:
                pipe.srem(self.keys.job_open_runs(job_name), run_id)
            for key in self._run_keys(run_id):
                pipe.pexpire(key, ttl_ms)
            pipe.execute()

    def _run_keys(self, run_id: str) -> list[str]:
        """Every key of a run: its record, log and RQ jobs, and each shard's keys and ledger."""
        keys = [self.keys.run(run_id), self.keys.run_events(run_id), self.keys.run_jobs(run_id)]
        for shard in range(self.store.shard_count(run_id)):
            keys += self.keys.shard(run_id, shard) + self.keys.effects(run_id, shard)
        return keys

    def resume(self, run_id: str, deadline: datetime | None = None) -> Decision:
        """Reopens a partial or failed run (optionally with a new deadline)."""
        info = self.info(run_id)
        if info["state"] not in ("partial", "failed", "canceled"):
            raise InvalidInput(
                f"run {run_id!r} is {info['state']}; only partial, failed or canceled runs resume"
            )
        fields: dict[str, Any] = {}
        if deadline is not None:
            fields["deadline_at"] = to_ms(deadline)
        elif int(info.get("deadline_at", "0")) <= to_ms(self.server_now()):
            raise InvalidInput(f"run {run_id!r} is past its deadline; pass --deadline")
        reason = "resumed by an operator"
        # A run whose plan never completed goes back to planning (re-planning adds what is missing).
        state = "running" if info.get("planned", "1") == "1" else "planning"
        self.transition(run_id, ("partial", "failed", "canceled"), state, reason, **fields)
        self.store.set_closed(run_id, False)
        with self.store.errors(run_id):
            pipe = self.client.pipeline(transaction=False)
            if info.get("job"):
                pipe.sadd(self.keys.job_open_runs(info["job"]), run_id)
            for key in self._run_keys(run_id):
                pipe.persist(key)
            pipe.execute()
        return self.event(run_id, "resume", reason)

    def cancel(self, run_id: str, reason: str = "canceled by an operator") -> bool:
        """Closes an open run as canceled."""
        self.store.set_closed(run_id, True)
        info = self.info(run_id)
        changed = self.transition(run_id, OPEN_STATES, "canceled", reason)
        if changed:
            self._retire(info.get("job", ""), run_id, 14)
            self.event(run_id, "cancel", reason)
        return changed

    def open_runs(self, job_name: str) -> list[str]:
        """The job's runs that are planning or running."""
        with self.store.errors():
            return sorted(
                as_text(r) for r in self.client.smembers(self.keys.job_open_runs(job_name))
            )


__all__ = ["Decision", "Item", "Runs"]
