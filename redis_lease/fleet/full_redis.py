"""A worker on a full Redis: it says so once a minute, and its RQ connection waits.

A Redis over its ``maxmemory`` under ``noeviction`` refuses the calls that could grow its
memory (``OOM``), before running them: nothing is half written. A worker rides it out as
it does a stall. A refused claim, heartbeat or tick is tried again. A refused commit, fail
or release waits while its lease holds. A handler's refused write gives its item back. The
worker goes on by itself once memory is freed. It logs one WARNING line per worker (its
forked shard jobs share what was said) every :data:`NOTICE_EVERY` seconds
(:func:`notice_full`), not one per item or per heartbeat, and one line when Redis takes
writes again.

RQ's own loop quits at the first error it does not expect. So the worker's RQ connection
(:func:`riding_out_full`) waits until Redis takes writes again, and tries a refused call
again.
"""

from __future__ import annotations

import logging
import mmap
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.exceptions import OutOfMemoryError

from ..errors import RedisFull
from ..protocol.connection.clients import describe, resilient, retry_backoff, retry_policy
from ..protocol.connection.translate import full_refusal

log = logging.getLogger("redis_lease.worker")

__all__ = [
    "NOTICE_EVERY",
    "RETRY_EVERY",
    "is_full",
    "notice_full",
    "notice_room",
    "riding_out_full",
]

#: Seconds between two lines saying that Redis is still full (one process).
NOTICE_EVERY = 60.0
#: Seconds between two tries of a call a full Redis refused, on the RQ connection.
RETRY_EVERY = 1.0

_T = TypeVar("_T")
_lock = threading.Lock()
#: What was said, shared with the processes forked from this one (a forking worker's shard
#: jobs), so that a worker says it once, not once per process: when it last said that Redis
#: is full (monotonic seconds, the same clock in every process; 0: never), and whether it
#: said since that Redis takes writes again (1.0) or not (0.0).
_said = mmap.mmap(-1, struct.calcsize("dd"))


def is_full(error: BaseException) -> bool:
    """True for a full Redis's refusal, raw (redis-py's) or translated (:class:`RedisFull`)."""
    return full_refusal("", error) is not None


def notice_full(error: BaseException, where: str) -> bool:
    """Logs a full Redis's refusal once per :data:`NOTICE_EVERY` seconds (one WARNING line
    naming ``where`` it was met: a shard's claims, the fleet watch...); True when ``error``
    is one (logged or kept quiet), False for any other error (the caller logs it)."""
    if not is_full(error):
        return False
    now = time.monotonic()
    with _lock:
        said, _ = struct.unpack_from("dd", _said)
        if said and now - said < NOTICE_EVERY:
            return True
        struct.pack_into("dd", _said, 0, now, 0.0)
    again = "still " if said else ""
    message = error.message if isinstance(error, RedisFull) else str(error)
    log.warning(
        "%s: Redis is %sfull: %s; this worker waits (what Redis refuses is tried again, "
        "settlements are kept while their leases hold) and goes on by itself once memory is "
        "freed; said again in %.0fs if it lasts",
        where,
        again,
        message,
        NOTICE_EVERY,
    )
    return True


def notice_room(where: str) -> None:
    """Says once, after a full Redis was noticed, that it takes writes again (once per line
    that said it was full)."""
    with _lock:
        said, room = struct.unpack_from("dd", _said)
        if not said or room:
            return
        struct.pack_into("dd", _said, 0, said, 1.0)
    log.warning("%s: Redis takes writes again: this worker goes on", where)


class _WaitForRoom(redis.retry.Retry):
    """The store's retry policy (:func:`~redis_lease.protocol.connection.clients.retry_policy`),
    and a call a full Redis refused tried again every :data:`RETRY_EVERY` seconds until it
    goes through. The refusal ran nothing (a transaction is refused whole), so the call is
    sent again as it was."""

    def __init__(self, where: str, server: str) -> None:
        self._policy = retry_policy()
        super().__init__(retry_backoff(), self._policy.get_retries())
        self._where, self._server = where, server

    def call_with_retry(  # redis-py's options passed on as they are
        self, do: Callable[[], _T], fail: Callable[..., Any], *options: Any, **named: Any
    ) -> _T:
        """Calls ``do`` under the store's policy; a full Redis's refusal waits and tries again."""
        waited = False
        while True:
            try:
                result = self._policy.call_with_retry(do, fail, *options, **named)
            except OutOfMemoryError as error:
                waited = True
                notice_full(full_refusal(self._server, error) or error, self._where)
                time.sleep(RETRY_EVERY)
                continue
            if waited:
                notice_room(self._where)
            return result


def riding_out_full(client: redis.Redis, where: str) -> redis.Redis:
    """A client for the same server as ``client`` (:func:`resilient`'s) that waits out a
    full Redis.

    A call that a full Redis refuses waits until Redis takes writes again, then is sent
    again. It is for RQ's worker loop, which would quit otherwise. ``where`` names the
    client in the log lines. An embedded or Sentinel client is returned as it is."""
    return resilient(client, retry=_WaitForRoom(where, describe(client)))
