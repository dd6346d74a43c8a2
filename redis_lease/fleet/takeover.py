"""Taking over the work of a shard job that stopped: its heartbeat is the signal.

A shard job registers in :attr:`~redis_lease.protocol.keys.Keys.shard_jobs` once its heartbeat
beats (who runs it: worker, lease owner, host, pid; what: job path, queue, budget) and
leaves at its end. Its lease keeper beats every :data:`~redis_lease.limits.HEARTBEAT`
second from a thread of its own, and a beat lives :data:`~redis_lease.limits.DEAD_AFTER`
seconds; so a registered shard job without a beat has stopped: its worker was killed,
powered off, cut off from Redis, or paused past its heartbeat's life. A handler that is
slow, but lets Python run its threads, keeps beating and is never taken over.

Whoever sees a stopped shard job first takes it over, once (one ``HDEL`` decides who):
every ``redis-lease worker`` looks every second
(:class:`~redis_lease.fleet.worker.watch.FleetWatch`),
and the tick looks too (:func:`~redis_lease.dispatch.live_jobs`). Taking over:

1. ends the job's leases now, by the server clock (``cut_leases.lua``): the next claim
   takes each item over with a new token, and the old holder, if it was only paused, is
   refused when it wakes (fencing), whatever its own clock says;
2. counts the shard job failed on its run (``status`` shows it), and records the takeover
   in the run's decisions and in the fleet's takeover log (``redis-lease workers``).

The watch then enqueues a shard job for the shard at the front of its queue, so that an
idle worker takes the items at once.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..errors import InvalidInput, NotFound, RedisLeaseError
from ..limits import SHARD_COUNT_MAX, TAKEOVER_LOG_CAP
from ..protocol.connection.clients import as_text
from ..protocol.store.lease_store import LeaseStore
from ..protocol.validation import check_id, clip
from .runs import Runs
from .shard_job_failures import record_job_failure

log = logging.getLogger("redis_lease.worker")

#: Takeovers kept in the fleet's takeover log (newest first).
TAKEOVER_LOG = TAKEOVER_LOG_CAP
#: Milliseconds a takeover, and a silent worker's record, stay in the views: a day.
KEPT_MS = 24 * 3600 * 1000
#: The longest text kept of a worker's or host's name.
NAME_MAX = 200
#: Why a shard job is taken over when nothing more is known.
STOPPED = "stopped beating: killed, paused or cut off from Redis"


@dataclass(frozen=True)
class ShardJob:
    """A shard job at work, as it registered.

    Attributes:
        rq_id: its RQ job id.
        run_id: the run it works.
        shard: the shard it works.
        worker: the RQ worker running it (its ``--name``).
        owner: the lease owner its claims name (host, process, job).
        host: the machine's name.
        pid: the process running the shard loop.
        path: the job's import path (``package.module:attr``).
        queue: the RQ queue it came from.
        budget: its time budget in seconds.
    """

    rq_id: str
    run_id: str
    shard: int
    worker: str
    owner: str
    host: str
    pid: int
    path: str
    queue: str
    budget: float

    def to_json(self) -> str:
        """The registry's text of this job (its RQ id is the field's name)."""
        fields = asdict(self)
        del fields["rq_id"]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, rq_id: str, raw: Any) -> ShardJob | None:
        """The job registered as ``raw`` under ``rq_id``; None when it cannot be read
        (anyone who can write the key may have written anything there)."""
        try:
            data = json.loads(as_text(raw))
            job = cls(
                rq_id=check_id(rq_id, "RQ job id"),
                run_id=check_id(str(data["run_id"]), "run id"),
                shard=int(data["shard"]),
                worker=clip(str(data["worker"]), NAME_MAX),
                owner=check_id(str(data["owner"]), "owner"),
                host=clip(str(data["host"]), NAME_MAX),
                pid=int(data["pid"]),
                path=str(data["path"]),
                queue=check_id(str(data["queue"]), "queue"),
                budget=float(data["budget"]),
            )
        except (ValueError, TypeError, KeyError, InvalidInput, UnicodeDecodeError):
            return None
        return job if 0 <= job.shard < SHARD_COUNT_MAX and job.budget > 0 else None


@dataclass(frozen=True)
class Takeover:
    """One stopped shard job taken over.

    Attributes:
        job: the shard job, as it registered.
        leases: its leases ended early (their items claimable now).
        at_ms: when, server clock.
    """

    job: ShardJob
    leases: int
    at_ms: int

    def line(self) -> str:
        """The takeover in one line, for logs and the worker's output."""
        job = self.job
        return (
            f"took over run {job.run_id} shard {job.shard} from worker {job.worker!r} "
            f"(host {job.host!r}, pid {job.pid}): its heartbeat stopped; "
            f"{self.leases} leases ended, their items claimable now"
        )


@dataclass(frozen=True)
class Registered:
    """A registry entry and its heartbeat: ``beat`` is what the keeper's last beat said
    (``pid``, ``held``), None when no beat lives; ``job`` is None when unreadable, and
    ``key`` is the entry's field as stored."""

    key: bytes
    job: ShardJob | None
    beat: dict[str, Any] | None


def register(store: LeaseStore, job: ShardJob) -> None:
    """Registers a shard job whose heartbeat already beats (the beat first: a watcher
    that sees the entry without a beat takes the job for stopped)."""
    with store.translating_errors(job.run_id):
        store.client.hset(store.keys.shard_jobs, job.rq_id, job.to_json())


def registered(store: LeaseStore) -> list[Registered]:
    """Every registered shard job and its heartbeat (two round trips)."""
    with store.translating_errors():
        entries = store.client.hgetall(store.keys.shard_jobs)
        jobs = [(_raw(key), _job(_raw(key), raw)) for key, raw in entries.items()]
        pipe = store.client.pipeline(transaction=False)
        readable = [job for _, job in jobs if job is not None]
        for job in readable:
            pipe.get(store.keys.run_beat(job.run_id, job.rq_id))
        beats = dict(zip((job.rq_id for job in readable), pipe.execute(), strict=True))
    return [Registered(key, job, _beat(beats.get(job.rq_id)) if job else None) for key, job in jobs]


def _raw(key: bytes | str) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


def _job(key: bytes, raw: Any) -> ShardJob | None:
    try:
        return ShardJob.from_json(key.decode(), raw)
    except UnicodeDecodeError:
        return None


def _beat(raw: Any) -> dict[str, Any] | None:
    """What a beat said; ``{}`` for a beat of an earlier version (the pid alone)."""
    if raw is None:
        return None
    try:
        said = json.loads(as_text(raw))
    except (ValueError, UnicodeDecodeError):
        return {}
    return said if isinstance(said, dict) else {}


def take_over(store: LeaseStore, job: ShardJob, why: str = STOPPED) -> Takeover | None:
    """Takes over a stopped shard job: ends its leases, counts it failed with ``why``,
    records it.

    Returns None when another watcher took it over first (or it ended meanwhile).
    """
    with store.translating_errors(job.run_id):
        pipe = store.client.pipeline(transaction=False)
        pipe.hdel(store.keys.shard_jobs, job.rq_id)
        pipe.delete(store.keys.run_beat(job.run_id, job.rq_id))
        won = pipe.execute()[0]
    if not won:
        return None
    try:
        cut = store.cut_leases(job.run_id, job.shard, job.owner)
    except NotFound:  # the run is gone: nothing to take over
        return None
    with store.translating_errors(job.run_id):
        store.client.hdel(store.keys.run_jobs(job.run_id), job.rq_id)
    done = Takeover(job, cut.leases, cut.now_ms)
    _record(store, done, why)
    return done


def _record(store: LeaseStore, done: Takeover, why: str) -> None:
    """Counts the takeover on the run and logs it in the run's decisions and the fleet's
    takeover log (best effort: logged when Redis refuses)."""
    job = done.job
    error = f"{why}; worker {job.worker}, its {done.leases} leases taken over"
    try:
        record_job_failure(store, job.run_id, job.shard, error)
        Runs(store).record_decision(job.run_id, "takeover", done.line())
        entry = {**asdict(job), "leases": done.leases, "at_ms": done.at_ms}
        with store.translating_errors(job.run_id):
            pipe = store.client.pipeline(transaction=False)
            pipe.lpush(store.keys.takeovers, json.dumps(entry, separators=(",", ":")))
            pipe.ltrim(store.keys.takeovers, 0, TAKEOVER_LOG - 1)
            pipe.pexpire(store.keys.takeovers, KEPT_MS)
            pipe.execute()
    except RedisLeaseError as error:
        log.warning("could not record the takeover of run %r: %s", job.run_id, error)


def takeovers(store: LeaseStore, count: int = TAKEOVER_LOG) -> list[dict[str, Any]]:
    """The newest takeovers, newest first (the entries that can be read)."""
    with store.translating_errors():
        raws = store.client.lrange(store.keys.takeovers, 0, count - 1)
    found = []
    for raw in raws:
        try:
            entry = json.loads(as_text(raw))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


def sweep(
    store: LeaseStore,
    entries: Sequence[Registered] | None = None,
    why: Callable[[ShardJob], str] = lambda job: STOPPED,
) -> list[Takeover]:
    """Takes over every registered shard job whose heartbeat is gone (``why``: what is
    known of its end); forgets entries nobody can read. Returns the takeovers made."""
    done: list[Takeover] = []
    for entry in registered(store) if entries is None else entries:
        if entry.job is None:
            log.warning("dropping an unreadable shard job entry %r", entry.key[:80])
            with store.translating_errors():
                store.client.hdel(store.keys.shard_jobs, entry.key)
        elif entry.beat is None:
            taken = take_over(store, entry.job, why(entry.job))
            if taken is not None:
                done.append(taken)
    return done
