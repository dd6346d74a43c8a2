"""A worker process of the fleet: :func:`run_worker` from Python, :func:`serve` under it and
under ``redis-lease worker``.

The worker is the RQ worker (:mod:`redis_lease.fleet.worker.rq_worker`) with its heartbeat
thread and, given jobs, the tick leader (:mod:`redis_lease.fleet.tick.leader`). The worker
and the tick may not import each other, so the module that joins them is a layer of its
own, above both and below the command line (docs/architecture.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from importlib import import_module

from .errors import InvalidInput
from .fleet.jobs.job import Job, load_job
from .fleet.tick.leader import TickLeader, check_jobs
from .fleet.worker.rq_worker import (
    DEFAULT_QUEUE,
    LeaseWorker,
    SimpleLeaseWorker,
    WorkerSettings,
    build_worker,
)
from .fleet.worker.rq_worker import run_worker as work_queues
from .limits import DEFAULT_PREFIX, TICK_EVERY
from .protocol.store.lease_store import LeaseStore

__all__ = ["run_worker", "serve"]


def run_worker(
    jobs: Sequence[str | Job] = (),
    url: str = "redis://localhost:6379/0",
    *,
    queues: Sequence[str] = (DEFAULT_QUEUE,),
    prefix: str = DEFAULT_PREFIX,
    queue_url: str | None = None,
    burst: bool = False,
    simple: bool = False,
    name: str | None = None,
    concurrency: int | None = None,
    tick_every: float = TICK_EVERY,
    say: Callable[[str], None] | None = print,
) -> None:
    """Runs a worker of the fleet, as ``redis-lease worker --job ...`` does, until SIGTERM or
    SIGINT (or, with ``burst``, until its queues are empty).

    It works the shard jobs of ``queues`` with a heartbeat thread beside it (heartbeats, takeover
    of dead workers' shard jobs). Given ``jobs``, it also runs the tick leader: it declares
    the jobs, and while this worker process holds the fleet's tick leader lease (one per
    ``prefix``, held under the process's own id) it ticks them every ``tick_every``
    seconds, with the jobs other workers declared that it finds in its own code (it names
    the others); when the leader dies or is paused another worker takes over within
    :data:`~redis_lease.limits.TICK_TAKEOVER_BOUND` seconds (docs/concepts/tick-leader.md).
    Each job is checked before anything starts, and the protocol stamp before anything is
    written (the worker is built as ``redis-lease worker`` builds it).

    Args:
        jobs: the jobs to tick: import paths (``"app.jobs:nightly"``), or :class:`Job`
            objects defined at the top level of an importable module (the tick records the
            path and the shard jobs import it).
        url: the lease store's Redis.
        queues: the RQ queues to work.
        prefix: the key prefix of the store.
        queue_url: RQ's Redis when it is not ``url``'s (required when ``url`` is a cluster).
        burst: stop once the queues are empty.
        simple: run shard jobs in this process (no fork per job).
        name: the worker's name (default: a new random one).
        concurrency: handlers each shard job runs at once (default: the jobs' own).
        tick_every: seconds between two ticks of the leader (at least 1).
        say: where the worker's lines go (started, shard jobs, leadership, ticks); None
            for nowhere.

    Raises:
        InvalidInput: a job does not import or is not well formed, or an option is wrong.
        ProtocolMismatch: the data under ``prefix`` is in a protocol this release does not
            speak (the command line's exit 9); nothing was written.
        RedisUnavailable: Redis cannot be reached, or refuses what a worker needs.
    """
    if tick_every < 1:
        raise InvalidInput(f"tick_every {tick_every} is under 1 second: give 1 or more")
    paths = [job if isinstance(job, str) else _path_of(job) for job in jobs]
    check_jobs(paths)
    settings = WorkerSettings(
        queues=tuple(queues),
        simple=simple,
        name=name,
        concurrency=concurrency,
        lease_url=url if queue_url else None,
        say=say,
    )
    store = LeaseStore.from_url(url, prefix, queue_url=queue_url)
    try:
        serve(store, settings, paths, burst=burst, tick_every=tick_every)
    finally:
        store.close()


def serve(
    store: LeaseStore,
    settings: WorkerSettings,
    jobs: Sequence[str] = (),
    *,
    burst: bool = False,
    tick_every: float = TICK_EVERY,
    started: Callable[[LeaseWorker | SimpleLeaseWorker], None] | None = None,
) -> LeaseWorker | SimpleLeaseWorker:
    """Builds the worker of ``settings`` on ``store`` and works its queues until it stops;
    given ``jobs`` (import paths, checked by the caller), the tick leader runs beside it.

    ``started`` is called with the worker once RQ registered it and its first heartbeat went
    out. :func:`run_worker` and ``redis-lease worker`` both start a worker this way.

    Returns:
        The worker, stopped: its counts of shard jobs say what it did.

    Raises:
        ProtocolMismatch: the data under the store's prefix is in a protocol this release
            does not speak; nothing was written.
        RedisUnavailable: Redis cannot be reached, or refuses what a worker needs.
    """
    worker = build_worker(store, settings)
    leader = [TickLeader(store, worker.name, jobs, settings.say, tick_every)] if jobs else []
    on_started = (lambda: started(worker)) if started is not None else None
    work_queues(worker, store, burst=burst, started=on_started, beside=leader)
    return worker


def _path_of(job: Job) -> str:
    """The import path of a Job object: the module-level name that holds it."""
    module = getattr(job.plan_items or job.handle_item, "__module__", None)
    if module and module != "__main__":
        for attr, value in vars(import_module(module)).items():
            if value is job:
                path = f"{module}:{attr}"
                if load_job(path) is job:
                    return path
    raise InvalidInput(
        f"job {job.name!r} is not defined at the top level of an importable module: give "
        "its import path, e.g. run_worker(jobs=['app.jobs:nightly'])"
    )
