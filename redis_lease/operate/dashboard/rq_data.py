"""RQ's queues and registries, read from Redis as they are: tolerantly (jobs in
:mod:`.rq_jobs`, workers in :mod:`.rq_workers`).

RQ's own readers raise on what they cannot read (``Job.fetch`` on a hash with bytes that
are not UTF-8, or a pickled call under the JSON serializer), and ``Worker.all`` removes the
workers it no longer finds (a write, refused to a read-only Redis user): one bad job would
take its whole page down. Here every read is a plain read command, every text is decoded
with replacement, nothing is unpickled, and a job or worker that cannot be read whole comes
back with what could be read and a note of what could not. Key names come from RQ's classes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis
from rq.job import JOB_ID_PATTERN
from rq.queue import Queue
from rq.registry import (
    CanceledJobRegistry,
    DeferredJobRegistry,
    FailedJobRegistry,
    FinishedJobRegistry,
    ScheduledJobRegistry,
    StartedJobRegistry,
)

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
        replies = [None if isinstance(r, Exception) else r for r in pipeline_replies(pipe)]
    width = len(REGISTRIES)
    return [
        dict(zip(REGISTRIES, replies[n * width : (n + 1) * width], strict=True))
        for n in range(len(names))
    ]


def pipeline_replies(pipe: Any) -> list[Any]:
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
        (found,) = pipeline_replies(pipe)
    if isinstance(found, Exception):
        return []  # its count shows as unknown
    return list(reversed(found)) if registry == "queued" and newest_first else list(found)


def job_id_of(member: bytes, registry: str) -> bytes:
    """The job id a list or registry member names (the started registry's members are
    ``<job id>:<execution id>``)."""
    return member.split(b":", 1)[0] if registry in _COMPOSITE else member
