"""What operators see of the worker processes: ``redis-lease workers`` and the dashboard.

One row per worker, from four records: the workers' own heartbeats and records
(:mod:`redis_lease.fleet.worker.watch`), the shard jobs at work with their heartbeats
(:mod:`redis_lease.fleet.transport.takeover`: a job is live while it is not dead by the
registry's rule), the fleet's takeover log, and the jobs the workers given jobs declared with
what the tick leader says of them (:mod:`redis_lease.protocol.store.declared_jobs`). A worker is
``alive`` while its heartbeat is younger than :data:`~redis_lease.limits.DEAD_AFTER` seconds,
``stopped`` once it said so on its way out, and ``dead`` otherwise; a worker known only from its
shard jobs or the takeovers of the last day (a plain ``rq worker`` sends no heartbeat of its
own) is ``unknown`` while a shard job of it sends heartbeats, else ``dead``. Every name is shown
as it was stored: it may be anything anyone wrote.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from ..fleet.transport import takeover
from ..limits import DEAD_AFTER_MS
from ..protocol.connection.clients import queue_time, time_ms
from ..protocol.store.declared_jobs import FleetJobs, declared_jobs
from ..protocol.store.lease_store import LeaseStore


@dataclass
class WorkerRow:
    """One worker process as operators see it.

    Attributes:
        name: its RQ name.
        state: ``alive``, ``dead``, ``stopped`` or ``unknown`` (see the module).
        host: its machine's name ('' when unknown).
        pid: its process id (None when unknown).
        queues: the queues it works.
        beat_age_s: seconds since its last heartbeat, server clock (None: it never sent one).
        shard_jobs: its shard jobs at work: run, shard, RQ id, leases held, and whether each
            still sends heartbeats (``beating``).
        leases_held: the leases its shard jobs hold now.
        taken_over: takeovers from it, newest first: run, shard, RQ id, leases, when (ms).
        leases_taken_over: the leases those takeovers ended.
        jobs: the jobs it declared to tick (``--job``), by name: their import paths.
        unticked_jobs: those of them no tick leader ticks: job, path and why.
        tick_leader: whether it holds the tick leader's live lease.
        tick_leader_token: the lease's fencing token while it holds it (None otherwise).
        tick_leader_since_ms: when it took the lease, server clock (None: not the leader,
            or a lease kept by a release older than this field).
    """

    name: str
    state: str = "unknown"
    host: str = ""
    pid: int | None = None
    queues: list[str] = field(default_factory=list)
    beat_age_s: float | None = None
    shard_jobs: list[dict[str, Any]] = field(default_factory=list)
    leases_held: int = 0
    taken_over: list[dict[str, Any]] = field(default_factory=list)
    leases_taken_over: int = 0
    jobs: dict[str, str] = field(default_factory=dict)
    unticked_jobs: list[dict[str, str]] = field(default_factory=list)
    tick_leader: bool = False
    tick_leader_token: int | None = None
    tick_leader_since_ms: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return asdict(self)


def _text(raw: Any) -> str:
    """Bytes from Redis as text, undecodable bytes replaced (names may hold anything)."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def _record(raw: Any) -> dict[str, Any]:
    try:
        data = json.loads(_text(raw))
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def worker_rows(store: LeaseStore, fleet: FleetJobs | None = None) -> list[WorkerRow]:
    """Every worker known to the fleet's records: alive ones first, then by name.

    ``fleet``: the declared jobs as read already (:func:`declared_jobs`), else they are read.
    """
    records_key, seen_key = store.keys.workers
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.hgetall(records_key)
        pipe.zrange(seen_key, 0, -1, withscores=True)
        queue_time(pipe)
        records, seen, now = pipe.execute()
    now_ms = time_ms(now)
    rows: dict[str, WorkerRow] = {}

    def row(name: str) -> WorkerRow:
        return rows.setdefault(name, WorkerRow(name))

    for raw_name, score in seen:
        found = row(_text(raw_name))
        found.beat_age_s = max(0.0, (now_ms - score) / 1000)
        found.state = "alive" if now_ms - score < DEAD_AFTER_MS else "dead"
    for raw_name, raw in records.items():
        found, record = row(_text(raw_name)), _record(raw)
        found.host = _text(record.get("host", ""))
        found.pid = record["pid"] if isinstance(record.get("pid"), int) else None
        queues = record.get("queues")
        found.queues = [_text(q) for q in queues] if isinstance(queues, list) else []
        if record.get("stopped_at") and found.state != "alive":
            found.state = "stopped"
    for entry in takeover.registered(store):
        job = entry.job
        if job is None:
            continue
        found = row(job.worker)
        held = int((entry.beat or {}).get("held", 0) or 0)
        found.shard_jobs.append(
            {
                "run": job.run_id,
                "shard": job.shard,
                "rq_id": job.rq_id,
                "leases_held": held,
                "beating": entry.beating,
            }
        )
        found.leases_held += held
        found.host = found.host or job.host
        found.pid = found.pid if found.pid is not None else job.pid
    for done in takeover.takeovers(store):
        at_ms = done.get("at_ms")
        if not isinstance(at_ms, int) or now_ms - at_ms > takeover.KEPT_MS:
            continue
        found = row(_text(done.get("worker", "")))
        leases = done["leases"] if isinstance(done.get("leases"), int) else 0
        found.taken_over.append(
            {
                "run": _text(done.get("run_id", "")),
                "shard": done.get("shard"),
                "rq_id": _text(done.get("rq_id", "")),
                "leases": leases,
                "at_ms": at_ms,
            }
        )
        found.leases_taken_over += leases
        found.host = found.host or _text(done.get("host", ""))
    fleet = declared_jobs(store) if fleet is None else fleet
    for declared in fleet.jobs.values():
        for name in declared.workers:
            found = row(name)
            found.jobs[declared.job] = declared.path
            if not declared.ticked:
                found.unticked_jobs.append(
                    {"job": declared.job, "path": declared.path, "reason": declared.reason}
                )
    if fleet.leader:
        leader = row(fleet.leader)
        leader.tick_leader, leader.tick_leader_token = True, fleet.token
        leader.tick_leader_since_ms = fleet.since_ms or None
    for found in rows.values():
        if found.state == "unknown" and not any(j["beating"] for j in found.shard_jobs):
            found.state = "dead"
    order = {"alive": 0, "unknown": 1, "dead": 2, "stopped": 3}
    return sorted(rows.values(), key=lambda r: (order[r.state], r.name))
