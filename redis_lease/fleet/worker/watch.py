"""A worker process's heartbeat, and the takeover of stopped shard jobs.

``redis-lease worker`` runs a :class:`FleetWatch` beside its RQ worker. Every
:data:`~redis_lease.limits.HEARTBEAT` second, in one round trip, it

1. sends the worker's heartbeat (``worker_beat.lua``: stamped with the server's time, so
   ``redis-lease workers`` judges every worker by one clock; workers silent for a day are
   forgotten); and
2. looks for registered shard jobs that are dead by the server's clock
   (``sweep_shard_jobs.lua``: one script call whatever the number of jobs; the rule is in
   :mod:`redis_lease.fleet.transport.takeover`), takes each over
   (:func:`redis_lease.fleet.transport.takeover.sweep`), then enqueues a shard job for its shard at
   the front of its queue (:func:`redispatch`), so an idle worker takes the items at once.

So a killed worker's items are claimable again within about ``DEAD_AFTER + HEARTBEAT``
seconds of its last heartbeat (6 s at the defaults), whether or not other shard jobs of its
run are at work. They are worked as soon as a worker is free. A Redis that stalls or fails
over takes no live worker's work: after it, every job has ``DEAD_AFTER`` seconds to send a
heartbeat again. A worker never takes over a shard job of its own.
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
from ...limits import HEARTBEAT, WORKER_NAME_MAX
from ...protocol.connection.clients import as_text
from ...protocol.connection.translate import REDIS_FAILURES
from ...protocol.replies import Swept
from ...protocol.scripts import Call
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import clip
from ..full_redis import notice_full
from ..runs.lifecycle import Runs
from ..runs.run_states import RUNNING
from ..transport import shard_jobs, takeover
from ..transport.shard_job_failures import FAILURE_STREAK_LIMIT, job_failures

log = logging.getLogger("redis_lease.worker")

#: Beats between two writes of the worker's record (its beat goes every time).
RECORD_EVERY = 30


def worker_record(queues: Sequence[str], started_at: float, *, stopped: bool = False) -> str:
    """The record a worker beats: its host, process, queues, start and (once) stop time
    (Unix seconds, the worker's clock)."""
    record: dict[str, object] = {
        "host": clip(socket.gethostname(), WORKER_NAME_MAX),
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
        now_ms, _forgotten = store.scripts.call(*_beat_call(store, name, record))
    return int(now_ms)


def _beat_call(store: LeaseStore, name: str, record: str) -> Call:
    args = [clip(name, WORKER_NAME_MAX) or "?", record, takeover.KEPT_MS]
    return Call("worker_beat", store.keys.workers, args)


def beat_and_look(store: LeaseStore, name: str, record: str = "") -> Swept:
    """Beats worker ``name`` and looks at the shard job registry, in one round trip."""
    with store.translating_errors():
        beaten, swept = store.scripts.many(
            [_beat_call(store, name, record), takeover.look_call(store)]
        )
    for reply in (beaten, swept):
        if isinstance(reply, Exception):
            raise store.translating_errors().error(reply)
    result: Swept = swept
    return result


def redispatch(store: LeaseStore, done: takeover.Takeover) -> str | None:
    """Enqueues a shard job, first in its queue, for the shard of a stopped job; None when
    its run is not running, or its failed shard jobs hold dispatch back, or its job's record
    holds a job path other than the one its entry names (an entry is anyone's to write: the
    tick decides then). A run no tick made (its job has no recorded path: made through
    ``Runs`` and shard jobs enqueued by its caller) gets the stopped job's path again."""
    job = done.job
    try:
        info = Runs(store).info(job.run_id)
    except NotFound:
        return None
    if info.get("state") != RUNNING or job_failures(info).streak >= FAILURE_STREAK_LIMIT:
        return None
    with store.translating_errors(job.run_id):
        recorded = store.client.hget(store.keys.job(info.get("job", "")), "path")
    if recorded is not None and as_text(recorded) != job.path:
        return None
    return shard_jobs.enqueue_shard(
        store, job.path, job.queue, job.run_id, job.shard, job.budget, at_front=True
    )


class FleetWatch(threading.Thread):
    """Sends a worker's heartbeat and takes over stopped shard jobs, every second.

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
        takeover.OWN_WORKERS.add(clip(name, WORKER_NAME_MAX))

    def run(self) -> None:
        """Ticks every :data:`~redis_lease.limits.HEARTBEAT` seconds until :meth:`close`
        (the first tick a second after the start: call :meth:`tick` before to beat at once)."""
        while not self._done.wait(HEARTBEAT):
            try:
                self.tick()
            except (RedisLeaseError, *REDIS_FAILURES) as error:
                if not notice_full(error, "fleet watch"):
                    log.warning("fleet watch: %s", error)

    def tick(self) -> None:
        """One beat, and one sweep for stopped shard jobs under each prefix."""
        due = self._beats % RECORD_EVERY == 0
        record = worker_record(self.queues, self._started_at) if due else ""
        swept = beat_and_look(self.store, self.name, record)
        self._beats += 1
        for prefix in self.prefixes():
            if prefix not in self._stores:
                self._stores[prefix] = self.store.with_prefix(prefix)
        for store in list(self._stores.values()):
            self._sweep(store, swept if store is self.store else None)

    def _sweep(self, store: LeaseStore, swept: Swept | None) -> None:
        why = partial(shard_jobs.stopped_job_why, store)
        for done in takeover.sweep(store, why=why, swept=swept):
            self.takeovers.append(done)
            replaced = redispatch(store, done)
            line = done.line() + (f"; shard job {replaced} enqueued first" if replaced else "")
            if self.say is not None:
                self.say(line)
            else:
                log.warning(line)

    def close(self) -> None:
        """Stops the thread and marks the worker stopped (best effort)."""
        self._done.set()
        if self.is_alive():
            self.join(timeout=5)
        try:
            record = worker_record(self.queues, self._started_at, stopped=True)
            beat_worker(self.store, self.name, record)
        except (RedisLeaseError, *REDIS_FAILURES) as error:
            log.warning("could not mark worker %r stopped: %s", self.name, error)
