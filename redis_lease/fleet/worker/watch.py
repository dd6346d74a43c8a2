"""A worker process's watch over the fleet: its own heartbeat, and the takeover of stopped
shard jobs.

``redis-lease worker`` runs a :class:`FleetWatch` beside its RQ worker. Every
:data:`~redis_lease.limits.HEARTBEAT` second it

1. beats the worker's record (``worker_beat.lua``: the beat at the server's time, so
   ``redis-lease workers`` judges every worker by one clock; workers silent for a day are
   forgotten); and
2. takes over every registered shard job whose heartbeat is gone
   (:func:`redis_lease.fleet.takeover.sweep`), then enqueues a shard job for its shard at the
   front of its queue (:func:`redispatch`), so an idle worker takes the items at once.

So a killed worker's items are claimable again within about ``DEAD_AFTER + HEARTBEAT``
seconds of its last beat (6 s at the defaults), whether or not other shard jobs of its run
are at work, and are worked as soon as a worker is free.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from functools import partial

from ...errors import NotFound, RedisLeaseError
from ...limits import HEARTBEAT
from ...protocol.connection.translate import REDIS_FAILURES
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import clip
from .. import shard_jobs, takeover
from ..run_states import RUNNING
from ..runs import Runs
from ..shard_job_failures import FAILURE_STREAK_LIMIT, job_failures

log = logging.getLogger("redis_lease.worker")

#: Beats between two writes of the worker's record (its beat goes every time).
RECORD_EVERY = 30


def worker_record(queues: Sequence[str], started_at: float, *, stopped: bool = False) -> str:
    """The record a worker beats: its host, process, queues, start and (once) stop time
    (Unix seconds, the worker's clock)."""
    record: dict[str, object] = {
        "host": clip(socket.gethostname(), takeover.NAME_MAX),
        "pid": os.getpid(),
        "queues": list(queues),
        "started_at": round(started_at, 3),
    }
    if stopped:
        record["stopped_at"] = round(time.time(), 3)
    return json.dumps(record, separators=(",", ":"))


def beat_worker(store: LeaseStore, name: str, record: str = "") -> int:
    """Beats worker ``name`` (and writes its record when given); returns the server's ms."""
    with store.translating_errors():
        now_ms, _forgotten = store.scripts.call(
            "worker_beat",
            store.keys.workers,
            [clip(name, takeover.NAME_MAX) or "?", record, takeover.KEPT_MS],
        )
    return int(now_ms)


def redispatch(store: LeaseStore, done: takeover.Takeover) -> str | None:
    """Enqueues a shard job, first in its queue, for the shard of a stopped job; None when
    its run is not running, or its failed shard jobs hold dispatch back (the tick decides)."""
    job = done.job
    try:
        info = Runs(store).info(job.run_id)
    except NotFound:
        return None
    if info.get("state") != RUNNING or job_failures(info).streak >= FAILURE_STREAK_LIMIT:
        return None
    return shard_jobs.enqueue_shard(
        store, job.path, job.queue, job.run_id, job.shard, job.budget, at_front=True
    )


class FleetWatch(threading.Thread):
    """Beats a worker's record and takes over stopped shard jobs, every second.

    It watches the shard jobs under the store's key prefix and under every prefix
    ``prefixes`` names (those of the shard jobs its worker has run).

    Args:
        store: the lease store (RQ's Redis is ``store.rq``).
        name: the RQ worker's name.
        queues: the queues it works.
        say: told one line per takeover (the worker prints them); None to only log them.
        prefixes: more key prefixes to watch, asked every tick.
    """

    def __init__(
        self,
        store: LeaseStore,
        name: str,
        queues: Sequence[str],
        say: Callable[[str], None] | None = None,
        prefixes: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        super().__init__(name="redis-lease-watch", daemon=True)
        self.store, self.name, self.queues, self.say = store, name, list(queues), say
        self.prefixes = prefixes
        self._stores = {store.prefix: store}
        self._done = threading.Event()
        self._beats = 0
        self._started_at = time.time()
        #: Takeovers this watch made.
        self.takeovers: list[takeover.Takeover] = []

    def run(self) -> None:
        """Ticks every :data:`~redis_lease.limits.HEARTBEAT` seconds until :meth:`close`
        (the first tick a second after the start: call :meth:`tick` before to beat at once)."""
        while not self._done.wait(HEARTBEAT):
            try:
                self.tick()
            except (RedisLeaseError, *REDIS_FAILURES) as error:
                log.warning("fleet watch: %s", error)

    def tick(self) -> None:
        """One beat, and one sweep for stopped shard jobs under each prefix."""
        due = self._beats % RECORD_EVERY == 0
        record = worker_record(self.queues, self._started_at) if due else ""
        beat_worker(self.store, self.name, record)
        self._beats += 1
        for prefix in self.prefixes():
            if prefix not in self._stores:
                self._stores[prefix] = self.store.with_prefix(prefix)
        for store in list(self._stores.values()):
            self._sweep(store)

    def _sweep(self, store: LeaseStore) -> None:
        for done in takeover.sweep(store, why=partial(shard_jobs.stopped_job_why, store)):
            self.takeovers.append(done)
            replaced = redispatch(store, done)
            line = done.line() + (f"; shard job {replaced} enqueued first" if replaced else "")
            if self.say is not None:
                self.say(line)
            else:
                log.warning(line)

    def close(self) -> None:
        """Stops the watch and marks the worker stopped (best effort)."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
        try:
            record = worker_record(self.queues, self._started_at, stopped=True)
            beat_worker(self.store, self.name, record)
        except (RedisLeaseError, *REDIS_FAILURES) as error:
            log.warning("could not mark worker %r stopped: %s", self.name, error)
