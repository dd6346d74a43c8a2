"""RQ's jobs, read from Redis as they are stored: every text decoded with replacement, a
call, result or meta loaded only when it is JSON (never unpickled), and what cannot be
read noted on the job (see :mod:`.rq_data`)."""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from rq.job import Job
from rq.results import Result

from .rq_data import is_job_id, is_text, pipeline_replies, text

#: Job hash fields that hold bytes (compressed or serialized), not text.
BINARY_FIELDS = frozenset({"data", "exc_info", "result", "meta"})
#: The most a compressed value is inflated to for a page (a planted one could inflate to
#: gigabytes).
INFLATED_MAX = 1 << 20
#: Where a job's results are: this and its id (a stream).
_RESULTS: bytes = Result.get_key("").encode()  # type: ignore[no-untyped-call]


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
        replies = pipeline_replies(pipe)
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


def _inflated(job: RqJob, what: str, value: bytes) -> bytes:
    """``value`` decompressed (zlib), at most :data:`INFLATED_MAX` bytes of it (a problem
    is noted when there is more). Raises zlib.error when it is not compressed."""
    inflater = zlib.decompressobj()
    inflated = inflater.decompress(value, INFLATED_MAX)
    if inflater.unconsumed_tail:
        job.problems.append(f"its {what} inflates past {INFLATED_MAX} bytes: cut there")
    return inflated


def _unzipped(job: RqJob, what: str, value: bytes) -> str:
    """A zlib-compressed text, or the stored bytes as text when they are not compressed."""
    with contextlib.suppress(zlib.error):  # else stored as it is
        value = _inflated(job, what, value)
    if not is_text(value):
        job.problems.append(f"its {what} is not UTF-8 text")
    return text(value)


def _no_constant(name: str) -> None:
    """NaN and Infinity are not JSON (Python reads them; a JSON reader would not)."""
    raise ValueError(f"{name} is not JSON")


def _decoded(job: RqJob, what: str, value: bytes | None, *, compressed: bool) -> Any:
    """A value RQ's JSON serializer wrote (zlib-compressed first for ``data``), or None
    with a problem noted: pickled values are never loaded."""
    if not value:
        return None
    if compressed:
        try:
            value = _inflated(job, what, value)
        except zlib.error:
            job.problems.append(f"its {what} is not zlib-compressed: cannot be read")
            return None
    try:
        return json.loads(value, parse_constant=_no_constant)
    except ValueError:
        kind = "pickled" if value[:1] == b"\x80" else "not JSON"
        job.problems.append(f"its {what} is {kind}: cannot be read (never unpickled)")
        return None
