"""RQ jobs a worker cannot run fail alone: the worker says why, counts them and goes on.

A job is bad when RQ cannot read its hash (bytes in a field it decodes that are not what
RQ wrote, or an id RQ refuses), when its data is not JSON (a pickled job, garbage) or
when its function does not import. RQ raises on the first two where it takes the job, and
its worker quits; a job whose function is missing fails only once it runs.
:class:`BadJobGuard` checks each job as the worker takes it, before it runs, and fails a
bad one as that job: it leaves RQ's queues, its status becomes ``failed``, it enters the
queue's failed registry with a failure result that says why, the worker prints one line
(the job, why, what to do) and counts it under the store's prefix
(:func:`count_bad_job`), which the exporter serves as ``redis_lease_bad_jobs_total``
(:func:`bad_job_counts`). Then it takes the next job.

Its hash is kept for a look, but for the fields RQ cannot read: those are quoted in the
failure result and removed, so that RQ and its dashboard can list and show the failed
job. A job whose id RQ refuses stays out of the failed registry (RQ could not list it).

A job RQ moved to a queue's intermediate list is failed by whoever removes it from that
list (the worker that took it, or the maintenance of another worker that finds it there
after its holder died), so it is failed and counted once.
"""

from __future__ import annotations

import importlib.util
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from rq import Queue
from rq.defaults import DEFAULT_FAILURE_TTL
from rq.exceptions import DeserializationError, NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.results import Result
from rq.utils import current_timestamp, now, utcformat
from rq.worker import BaseWorker

from ...errors import RedisLeaseError
from ...protocol.connection.clients import as_text
from ...protocol.store.lease_store import LeaseStore

#: The longest text a line or a failure result quotes from a job (ids, names, errors).
SHOWN_MAX = 300
#: A pickle's first byte (protocol 2 and later): a job not written as JSON.
PICKLE_MARK = b"\x80"
#: RQ moves a job it takes from a worker's only queue to the queue's intermediate list
#: (LMOVE) from this Redis version on; otherwise it pops it.
LMOVE_SINCE = (6, 2, 0)
_JSON_FIX = "enqueue it with RQ's JSON serializer (rq cron: examples/scheduling/rq_cron.py)"
#: Why a job is bad: RQ cannot read its hash or data / its function does not import.
UNREADABLE = "unreadable"
UNIMPORTABLE = "unimportable"
REASONS = (UNREADABLE, UNIMPORTABLE)


@dataclass(frozen=True)
class BadJob:
    """Why a job cannot run and what to do about it.

    Attributes:
        reason: :data:`UNREADABLE` or :data:`UNIMPORTABLE` (the counter's label).
        why: what is wrong, one line.
        fix: what to do, one line.
        error: the exception that said so.
        fields: the fields of its hash RQ cannot read, with their bytes (removed from
            the hash when the job is failed).
        valid_id: whether RQ accepts its id (a job it refuses stays out of the failed
            registry).
    """

    reason: str
    why: str
    fix: str
    error: BaseException
    fields: dict[bytes, bytes] = field(default_factory=dict)
    valid_id: bool = True

    def failure(self) -> str:
        """The error its failure result keeps: the traceback, the fields removed from its
        hash as text, and the line's why and fix last."""
        quoted = "".join(
            f"{shown(name.decode(errors='backslashreplace'))} = {shown(value)}\n"
            for name, value in self.fields.items()
        )
        return (
            "".join(traceback.format_exception(self.error))
            + (f"fields removed from the job's hash:\n{quoted}" if quoted else "")
            + f"redis_lease: {self.why}; {self.fix}\n"
        )


def shown(value: Any, limit: int = SHOWN_MAX) -> str:
    """``value`` as one line of printable text: other characters escaped, clipped."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(value))
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _error_text(error: BaseException) -> str:
    """``Type: message`` of the first of the error's cause, itself and its context that
    has a message (RQ raises a bare DeserializationError from the serializer's error)."""
    chain = [e for e in (error.__cause__, error, error.__context__) if e is not None]
    said = next((e for e in chain if str(e)), error)
    return shown(f"{type(said).__name__}: {said}")


def unreadable_hash(worker: BaseWorker, job_id: str, error: BaseException) -> BadJob:
    """A job ``worker`` could not read (``Job.fetch`` raised ``error``): its id, or the
    fields of its hash RQ cannot read (each is tried alone, with the job's data)."""
    job_class = worker.job_class
    key = job_class.key_for(job_id)
    try:
        job_class(job_id, connection=worker.connection)
    except ValueError as refused:
        return BadJob(
            UNREADABLE,
            f"RQ refuses its id ({_error_text(refused)})",
            f"delete its hash {shown(key)}: RQ did not write it",
            refused,
            valid_id=False,
        )
    try:
        raw = cast(dict[bytes, bytes], worker.connection.hgetall(key))
    except redis.RedisError:  # the job is failed all the same, its fields unnamed
        raw = {}
    unread: dict[bytes, bytes] = {}
    said = error
    for name, value in raw.items():
        if name == b"data":
            continue
        try:
            job_class(connection=worker.connection, serializer=worker.serializer).restore(
                {b"data": raw.get(b"data", b""), name: value}
            )
        except Exception as failed:  # whatever RQ raises on the field
            said = failed if not unread else said  # the first field's error is quoted
            unread[name] = value
    if not unread:  # no field alone: their combination, or the hash is gone
        return BadJob(
            UNREADABLE,
            f"RQ cannot read the job ({_error_text(error)})",
            f"delete its hash {shown(key)} and enqueue the job again with RQ",
            error,
        )
    names = ", ".join(shown(n.decode(errors="backslashreplace")) for n in unread)
    return BadJob(
        UNREADABLE,
        f"RQ cannot read its fields {names} ({_error_text(said)})",
        "they are quoted in its failure result and removed from its hash; find what wrote "
        "them, then enqueue the job again with RQ",
        error,
        unread,
    )


def unrunnable(job: RQJob) -> BadJob | None:
    """Why ``job`` cannot run here, or None: its data must decode and its function import.

    Importing the function imports its module in this process, as the job itself would.
    """
    try:
        name = job.func_name
    except DeserializationError as error:
        if job.data.startswith(PICKLE_MARK):
            why = "its data is a pickle; this worker reads JSON only"
        else:
            why = f"its data is not JSON ({_error_text(error)})"
        return BadJob(UNREADABLE, why, _JSON_FIX, error)
    try:
        job.func  # noqa: B018  (imports the function)
    except Exception as error:  # whatever its module raises on import
        top = str(name).split(".")[0]
        try:
            found = bool(top) and importlib.util.find_spec(top) is not None
        except (ImportError, ValueError):
            found = False
        problem = _error_text(error) if found else f"no module {shown(top)} on this worker"
        return BadJob(
            UNIMPORTABLE,
            f"its function {shown(name)} does not import ({problem})",
            "install its module where the worker runs (it imports jobs from its working "
            "directory) or delete the job",
            error,
        )
    return None


class BadJobGuard(BaseWorker):
    """Fails each bad job the worker takes (see the module) and takes the next one.

    Lines go to :attr:`say`, else to the worker's log; counts go to :attr:`bad_job_store`
    (``redis-lease worker`` sets it), none when it is None.
    """

    say: Callable[[str], None] | None = None
    bad_job_store: LeaseStore | None = None
    #: Bad jobs this worker failed.
    bad_jobs = 0

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[RQJob, Queue] | None:
        """Takes the next job RQ gives that can run; fails the bad ones on the way."""
        while True:
            try:
                taken = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
            except Exception as error:
                job_id, queue = getattr(error, "job_id", None), getattr(error, "queue", None)
                if not isinstance(job_id, str) or not isinstance(queue, Queue):
                    raise  # not a job RQ could not read: RQ's own handling
                unread = unreadable_hash(self, job_id, error)
                self.fail_bad_job(job_id, queue, unread, self._moved())
                continue
            if taken is None:
                return None
            job, queue = taken
            bad = unrunnable(job)
            if bad is None:
                return taken
            self.fail_bad_job(job.id, queue, bad, self._moved(), job.failure_ttl)

    def clean_registries(self) -> None:
        """Fails the unreadable jobs left in the queues' intermediate lists (their worker
        died holding them), which RQ's cleanup cannot read, then cleans as RQ does."""
        for queue in self.queues:
            for raw in self.connection.lrange(queue.intermediate_queue_key, 0, -1):
                job_id = as_text(raw)
                try:
                    self.job_class.fetch(
                        job_id, connection=self.connection, serializer=self.serializer
                    )
                except NoSuchJobError:
                    continue
                except Exception as error:  # whatever RQ raises on the hash
                    self.fail_bad_job(job_id, queue, unreadable_hash(self, job_id, error), True)
        super().clean_registries()  # type: ignore[no-untyped-call]

    def _moved(self) -> bool:
        """Whether RQ moved the job it took to its queue's intermediate list."""
        version: tuple[int, int, int] = self.get_redis_server_version()  # type: ignore[no-untyped-call]
        return len(self.queues) == 1 and version >= LMOVE_SINCE

    def fail_bad_job(
        self, job_id: str, queue: Queue, bad: BadJob, moved: bool, ttl: int | None = None
    ) -> None:
        """Fails the job ``job_id`` of ``queue`` as ``bad`` (see the module), says so and
        counts it, kept ``ttl`` seconds (the job's ``failure_ttl``; RQ's default when
        None). ``moved``: it waits in the intermediate list, and whoever removes it from
        there fails it. A Redis error leaves it to RQ's maintenance, with a line."""
        where = f"job {shown(job_id)} (queue {shown(queue.name)})"
        ttl = ttl if ttl is not None and ttl > 0 else DEFAULT_FAILURE_TTL  # -1: kept a year
        try:
            removed = self.connection.lrem(queue.intermediate_queue_key, 1, job_id)
            if moved and not removed:
                return  # another worker removed it, and fails it
            with self.connection.pipeline() as pipe:
                key = self.job_class.key_for(job_id)
                if bad.fields:
                    pipe.hdel(key, *bad.fields)
                if b"origin" in bad.fields:  # RQ lists a failed job under its origin
                    pipe.hset(key, "origin", queue.name)
                pipe.hset(
                    key, mapping={"status": JobStatus.FAILED.value, "ended_at": utcformat(now())}
                )
                pipe.expire(key, ttl)
                if bad.valid_id:
                    pipe.zadd(queue.failed_job_registry.key, {job_id: current_timestamp() + ttl})
                Result(
                    job_id,
                    Result.Type.FAILED,
                    self.connection,
                    exc_string=bad.failure(),
                    worker_name=self.name,
                    serializer=self.serializer,
                ).save(ttl, pipeline=pipe)  # type: ignore[no-untyped-call]
                self.increment_failed_job_count(pipe)
                pipe.execute()
        except redis.RedisError as error:
            self._line(f"{where} cannot run ({bad.why}) and could not be failed: {error}")
            return
        self.bad_jobs += 1
        counted = self._count(queue.name, bad.reason)
        registry = f"rq:failed:{shown(queue.name)}" if bad.valid_id else "not kept: bad id"
        self._line(
            f"{where} failed without running: {bad.why}; {bad.fix} (RQ's failed registry: "
            f"{registry}){counted}"
        )

    def _count(self, queue_name: str, reason: str) -> str:
        """Counts a bad job; the line's note when it could not be counted."""
        if self.bad_job_store is None:
            return ""
        try:
            count_bad_job(self.bad_job_store, queue_name, reason)
        except RedisLeaseError as error:
            return f" (not counted: {error})"
        return ""

    def _line(self, text: str) -> None:
        if self.say is not None:
            self.say(text)
        else:
            self.log.error("%s", text)


# -- their counts ------------------------------------------------------------------
# Kept in Redis for the exporter: the hash ``<prefix>:rq:bad_jobs``, one field
# ``<reason>:<queue>`` per reason and queue, made by the first bad job (a worker with no
# bad job writes nothing). The prefix is the worker's store's (``--prefix``): a job that
# cannot be read does not say whose it is.


def count_bad_job(store: LeaseStore, queue: str, reason: str) -> None:
    """Counts one bad job of ``queue`` failed for ``reason``."""
    with store.translating_errors():
        store.client.hincrby(store.keys.bad_jobs, f"{reason}:{queue}", 1)


def bad_job_counts(store: LeaseStore) -> dict[tuple[str, str], int]:
    """Every count, by ``(queue, reason)``: each reason of each queue counted at all (0 for
    the reasons it has none of), so that ``increase()`` sees the first of each."""
    with store.translating_errors():
        raw = store.client.hgetall(store.keys.bad_jobs)
    counts = {}
    for field_name, value in raw.items():
        reason, _, queue = as_text(field_name).partition(":")
        counts.update({(queue, other): 0 for other in REASONS if (queue, other) not in counts})
        counts[(queue, reason)] = int(value)
    return counts


__all__ = [
    "REASONS",
    "UNIMPORTABLE",
    "UNREADABLE",
    "BadJob",
    "BadJobGuard",
    "bad_job_counts",
    "count_bad_job",
    "shown",
    "unreadable_hash",
    "unrunnable",
]
