"""RQ's queues, registries, jobs and workers, read from Redis as they are: tolerantly.

RQ's own readers raise on what they cannot read (``Job.fetch`` on a hash with bytes that
are not UTF-8, or a pickled call under the JSON serializer), and ``Worker.all`` removes the
workers it no longer finds (a write, refused to a read-only Redis user): one bad job would
take its whole page down. Here every read is a plain read command, every text is decoded
with replacement, nothing is unpickled, and a job or worker that cannot be read whole comes
back with what could be read and a note of what could not. Key names come from RQ's classes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import redis
from rq.defaults import RQ_KEY_PREFIX
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE
from rq.job import JOB_ID_PATTERN, Job
from rq.queue import Queue
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)
from rq.results import Result
from rq.worker import Worker

#: A queue's list and its registries, by the name the pages use, in the order they show.
REGISTRY_KEYS = {
    "queued": Queue.redis_queue_namespace_prefix,
    "started": StartedJobRegistry.key_template.format(""),
    "deferred": DeferredJobRegistry.key_template.format(""),
    "scheduled": ScheduledJobRegistry.key_template.format(""),
    "finished": FinishedJobRegistry.key_template.format(""),
    "failed": FailedJobRegistry.key_template.format(""),
    "canceled": CanceledJobRegistry.key_template.format(""),
}
REGISTRIES = tuple(REGISTRY_KEYS)
#: Job hash fields that hold bytes (compressed or serialized), not text.
BINARY_FIELDS = frozenset({"data", "exc_info", "result", "meta"})
#: Where a job's results are: this and its id (a stream).
_RESULTS: bytes = Result.get_key("").encode()  # type: ignore[no-untyped-call]
#: A worker's running executions (a set of ``<job id>:<execution id>``), and one execution.
_EXECUTIONS = tuple(part.encode() for part in WORKER_EXECUTIONS_KEY_TEMPLATE.split("{0}"))
_EXECUTION = f"{RQ_KEY_PREFIX}:execution:".encode()
#: The started registry's members are ``<job id>:<execution id>``.
_COMPOSITE = frozenset({"started"})


def text(value: bytes | str | None) -> str:
    """``value`` as text: bytes decoded as UTF-8, what is not UTF-8 replaced by U+FFFD."""
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def as_bytes(value: bytes | str) -> bytes:
    """``value`` as bytes (a client that decodes replies gives str)."""
    return value.encode() if isinstance(value, str) else value


def is_text(value: bytes) -> bool:
    """Whether ``value`` is valid UTF-8."""
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def is_job_id(job_id: str) -> bool:
    """Whether ``job_id`` is one RQ accepts (A-Z a-z 0-9 _ -), so one a URL can name."""
    return JOB_ID_PATTERN.fullmatch(job_id) is not None


def registry_key(queue: bytes, registry: str) -> bytes:
    """The Redis key of ``queue``'s list (``queued``) or one of its registries."""
    return REGISTRY_KEYS[registry].encode() + queue


# -- queues ----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueCounts:
    """A queue as RQ lists it in ``rq:queues``: its name and its jobs by registry."""

    raw_name: bytes
    #: Jobs by registry; None where the key is not of the type RQ writes there.
    counts: dict[str, int | None]

    @property
    def name(self) -> str:
        """The name as text (with U+FFFD where it is not UTF-8)."""
        return text(self.raw_name)

    @property
    def addressable(self) -> bool:
        """Whether a URL can name this queue: its name is UTF-8 text."""
        return is_text(self.raw_name)


def queues(conn: redis.Redis) -> list[QueueCounts]:
    """Every queue in RQ's set of queues with its counts, by name (one round trip)."""
    prefix = Queue.redis_queue_namespace_prefix.encode()
    listed = [as_bytes(member) for member in conn.smembers(Queue.redis_queues_keys)]
    names = sorted(m[len(prefix) :] for m in listed if m.startswith(prefix))
    return [QueueCounts(n, c) for n, c in zip(names, _counts(conn, names), strict=True)]


def queue_counts(conn: redis.Redis, name: str) -> QueueCounts | None:
    """One queue's counts; None when RQ knows no such queue (not listed, and empty)."""
    raw = name.encode()
    (counts,) = _counts(conn, [raw])
    key = registry_key(raw, "queued")
    listed = conn.sismember(Queue.redis_queues_keys, cast(str, key))  # bytes are sent as they are
    return QueueCounts(raw, counts) if listed or any(counts.values()) else None


def _counts(conn: redis.Redis, names: Sequence[bytes]) -> list[dict[str, int | None]]:
    """The jobs of each queue by registry: LLEN of the list, ZCARD of each registry."""
    with conn.pipeline(transaction=False) as pipe:
        for name in names:
            for registry in REGISTRIES:
                key = registry_key(name, registry)
                if registry == "queued":
                    pipe.llen(key)
                else:
                    pipe.zcard(key)
        replies = [None if isinstance(r, Exception) else r for r in _replies(pipe)]
    width = len(REGISTRIES)
    return [
        dict(zip(REGISTRIES, replies[n * width : (n + 1) * width], strict=True))
        for n in range(len(names))
    ]


def _replies(pipe: Any) -> list[Any]:
    """The pipeline's replies, an error reply (a key of another type) in its place."""
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return replies


def members(
    conn: redis.Redis,
    queue: bytes,
    registry: str,
    start: int = 0,
    count: int = -1,
    newest_first: bool = False,
) -> list[bytes]:
    """Up to ``count`` (-1: all) members of a queue's list or registry from position ``start``,
    as stored: the list in queue order (next first), a registry by score (oldest first);
    ``newest_first`` reverses either. Empty when the key is not of the type RQ writes there.
    """
    key = registry_key(queue, registry)
    stop = -1 if count < 0 else start + count - 1
    with conn.pipeline(transaction=False) as pipe:
        if registry != "queued":
            pipe.zrange(key, start, stop, desc=newest_first)
        elif newest_first:
            pipe.lrange(key, -stop - 1 if stop >= 0 else 0, -start - 1)
        else:
            pipe.lrange(key, start, stop)
        (found,) = _replies(pipe)
    if isinstance(found, Exception):
        return []  # its count shows as unknown
    return list(reversed(found)) if registry == "queued" and newest_first else list(found)


def job_id_of(member: bytes, registry: str) -> bytes:
    """The job id a list or registry member names (the started registry's members are
    ``<job id>:<execution id>``)."""
    return member.split(b":", 1)[0] if registry in _COMPOSITE else member


# -- jobs --------------------------------------------------------------------------------


@dataclass
class RqJob:
    """One RQ job as stored: its text fields, what its data decodes to, and its problems."""

    raw_id: bytes
    #: Every field of the job hash as text; a binary field as a note of its size.
    fields: dict[str, str]
    #: The call (function, instance, args, kwargs) when its data is JSON, else None.
    call: Any = None
    #: The latest result's traceback, or the job's own (older RQ), as text.
    exc_info: str | None = None
    result: Any = None
    meta: Any = None
    #: What could not be read, one line each ("its data is not JSON: ...").
    problems: list[str] = field(default_factory=list)

    @property
    def id(self) -> str:
        """The job id as text."""
        return text(self.raw_id)

    @property
    def addressable(self) -> bool:
        """Whether a URL can name this job (an id RQ accepts)."""
        return is_text(self.raw_id) and is_job_id(self.id)

    def get(self, name: str) -> str:
        """The text of field ``name`` ('' when absent)."""
        return self.fields.get(name, "")

    def to_dict(self) -> dict[str, Any]:
        """The job for the JSON views (the field names rq-dashboard's JSON used)."""
        return {
            "id": self.id,
            "status": self.get("status"),
            "origin": self.get("origin"),
            "description": self.get("description"),
            "created_at": self.get("created_at") or None,
            "enqueued_at": self.get("enqueued_at") or None,
            "started_at": self.get("started_at") or None,
            "ended_at": self.get("ended_at") or None,
            "worker_name": self.get("worker_name") or None,
            "exc_info": self.exc_info,
            "result": self.result,
            "metadata": self.meta,
            "problems": self.problems,
        }


def read_jobs(conn: redis.Redis, ids: Sequence[bytes]) -> list[RqJob | None]:
    """The jobs of ``ids`` in order, None for each that is not in Redis (one round trip)."""
    with conn.pipeline(transaction=False) as pipe:
        for raw in ids:
            pipe.hgetall(Job.redis_job_namespace_prefix.encode() + raw)
            pipe.xrevrange(_RESULTS + raw, "+", "-", count=1)
        replies = _replies(pipe)
    return [
        _job(raw, replies[2 * n], replies[2 * n + 1]) if replies[2 * n] else None
        for n, raw in enumerate(ids)
    ]


def read_job(conn: redis.Redis, job_id: str) -> RqJob | None:
    """One job, or None when it is not in Redis."""
    (job,) = read_jobs(conn, [job_id.encode()])
    return job


def _job(raw_id: bytes, stored: dict[bytes, bytes] | Exception, latest: Any) -> RqJob:
    """A job from its hash and its latest result (XREVRANGE's reply, maybe empty); either
    may be an error reply (a key of another type)."""
    job = RqJob(raw_id, {})
    if not is_text(raw_id):
        job.problems.append("its id is not UTF-8 text")
    if isinstance(stored, Exception):
        job.problems.append("its key is not a hash: cannot be read")
        return job
    for raw_name, value in stored.items():
        name = text(raw_name)
        if name in BINARY_FIELDS:
            job.fields[name] = f"({len(value)} bytes)"
            continue
        job.fields[name] = text(value)
        if not is_text(value) or not is_text(raw_name):
            job.problems.append(f"its {name!r} field is not UTF-8 text")
    fields = {text(k): v for k, v in stored.items()}
    job.call = _decoded(job, "data", fields.get("data"), compressed=True)
    job.meta = _decoded(job, "meta", fields.get("meta"), compressed=False)
    job.result = _decoded(job, "result", fields.get("result"), compressed=False)
    if fields.get("exc_info"):
        job.exc_info = _unzipped(job, "exc_info", fields["exc_info"])
    if isinstance(latest, Exception):
        job.problems.append("its results are not a stream: cannot be read")
    elif latest:
        _read_result(job, {text(k): v for k, v in latest[0][1].items()})
    return job


def _read_result(job: RqJob, result: dict[str, bytes]) -> None:
    """Takes the traceback and return value of the job's latest result."""
    if result.get("exc_string"):
        raw = _unbased(job, "latest result's traceback", result["exc_string"])
        if raw is not None:
            job.exc_info = _unzipped(job, "latest result's traceback", raw)
    if result.get("return_value"):
        raw = _unbased(job, "latest result's return value", result["return_value"])
        if raw is not None:
            job.result = _decoded(job, "latest result's return value", raw, compressed=False)


def _unbased(job: RqJob, what: str, value: bytes) -> bytes | None:
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        job.problems.append(f"its {what} is not base64: not shown")
        return None


def _unzipped(job: RqJob, what: str, value: bytes) -> str:
    """A zlib-compressed text, or the stored bytes as text when they are not compressed."""
    with contextlib.suppress(zlib.error):  # else stored as it is
        value = zlib.decompress(value)
    if not is_text(value):
        job.problems.append(f"its {what} is not UTF-8 text")
    return text(value)


def _decoded(job: RqJob, what: str, value: bytes | None, *, compressed: bool) -> Any:
    """A value RQ's JSON serializer wrote (zlib-compressed first for ``data``), or None
    with a problem noted: pickled values are never loaded."""
    if not value:
        return None
    if compressed:
        try:
            value = zlib.decompress(value)
        except zlib.error:
            job.problems.append(f"its {what} is not zlib-compressed: cannot be read")
            return None
    try:
        return json.loads(value)
    except ValueError:
        kind = "pickled" if value[:1] == b"\x80" else "not JSON"
        job.problems.append(f"its {what} is {kind}: cannot be read (never unpickled)")
        return None


# -- workers -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RqWorker:
    """One RQ worker as its hash stores it, every field as text, and the jobs it runs."""

    raw_name: bytes
    fields: dict[str, str]
    problems: tuple[str, ...]
    #: The ids of the jobs it is running (its live executions'), as stored.
    running: tuple[bytes, ...] = ()

    @property
    def current_job(self) -> str:
        """The id of a job it is running ('' when idle); RQ before 2.0 kept it in its hash."""
        return text(self.running[0]) if self.running else self.get("current_job")

    @property
    def name(self) -> str:
        """The worker's name as text."""
        return text(self.raw_name)

    def get(self, name: str) -> str:
        """The text of field ``name`` ('' when absent)."""
        return self.fields.get(name, "")

    @property
    def queues(self) -> list[str]:
        """The queues it listens to."""
        return [q for q in self.get("queues").split(",") if q]

    @property
    def state(self) -> str:
        """Its state (busy, idle, suspended, ...), as it last said."""
        return self.get("state") or "?"

    def to_dict(self, current_job: RqJob | None) -> dict[str, Any]:
        """The worker for the JSON views (the field names rq-dashboard's JSON used)."""
        current: Any = "idle"
        if self.current_job:
            current = {
                "job_id": self.current_job,
                "description": current_job.get("description") if current_job else None,
                "created_at": (current_job.get("created_at") or None) if current_job else None,
            }
        return {
            "name": self.name,
            "state": self.state,
            "queues": self.queues,
            "current_job": current,
            "pid": self.get("pid") or None,
            "hostname": self.get("hostname") or None,
            "birth_date": self.get("birth") or None,
            "last_heartbeat": self.get("last_heartbeat") or None,
            "successful_job_count": self.get("successful_job_count") or None,
            "failed_job_count": self.get("failed_job_count") or None,
            "total_working_time": self.get("total_working_time") or None,
            "version": self.get("version"),
            "python_version": self.get("python_version"),
            "problems": list(self.problems),
        }


def workers(conn: redis.Redis) -> list[RqWorker]:
    """Every worker in RQ's set of workers whose hash is still there, by name, with the
    jobs it runs (three round trips, whatever the number of workers)."""
    prefix = Worker.redis_worker_namespace_prefix.encode()
    keys = sorted(as_bytes(key) for key in conn.smembers(Worker.redis_workers_keys))
    names = [key[len(prefix) :] if key.startswith(prefix) else key for key in keys]
    with conn.pipeline(transaction=False) as pipe:
        for key, name in zip(keys, names, strict=True):
            pipe.hgetall(key)
            pipe.smembers(_EXECUTIONS[0] + name + _EXECUTIONS[1])
        replies = _replies(pipe)
    hashes, executions = replies[0::2], replies[1::2]
    running = _running(conn, [set() if isinstance(e, Exception) else e for e in executions])
    found = []
    for name, stored, jobs in zip(names, hashes, running, strict=True):
        if not stored or isinstance(stored, Exception):
            continue  # gone (RQ's own reader would remove it from the set: a write)
        problems = [] if is_text(name) else ["its name is not UTF-8 text"]
        problems += [
            f"its {text(k)!r} field is not UTF-8 text"
            for k, v in stored.items()
            if not (is_text(k) and is_text(v))
        ]
        fields = {text(k): text(v) for k, v in stored.items()}
        found.append(RqWorker(name, fields, tuple(problems), jobs))
    return found


def _running(conn: redis.Redis, executions: list[set[bytes]]) -> list[tuple[bytes, ...]]:
    """Each worker's running job ids: its executions whose hash is still there."""
    members = [sorted(as_bytes(m) for m in found) for found in executions]
    with conn.pipeline(transaction=False) as pipe:
        for found in members:
            for member in found:
                pipe.exists(_EXECUTION + member)
        live = iter(_replies(pipe))
    running = []
    for found in members:
        alive = [member for member in found if next(live) == 1]
        running.append(tuple(member.split(b":", 1)[0] for member in alive))
    return running
