"""RQ's workers, read from Redis as they are stored, with the jobs they run: plain reads
only (RQ's ``Worker.all`` removes what it no longer finds, a write), every text decoded with
replacement (see :mod:`.rq_data`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis
from rq.defaults import RQ_KEY_PREFIX
from rq.executions import WORKER_EXECUTIONS_KEY_TEMPLATE
from rq.worker import Worker

from .rq_data import as_bytes, is_text, pipeline_replies, text
from .rq_jobs import RqJob

#: A worker's running executions (a set of ``<job id>:<execution id>``), and one execution.
_EXECUTIONS = tuple(part.encode() for part in WORKER_EXECUTIONS_KEY_TEMPLATE.split("{0}"))
_EXECUTION = f"{RQ_KEY_PREFIX}:execution:".encode()


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

    def job_count(self, name: str) -> str:
        """The text of a job counter (``successful_job_count``, ``failed_job_count``):
        "0" when absent, as RQ writes a counter only when it first counts a job."""
        return self.get(name) or "0"

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
            "successful_job_count": self.job_count("successful_job_count"),
            "failed_job_count": self.job_count("failed_job_count"),
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
        replies = pipeline_replies(pipe)
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
        live = iter(pipeline_replies(pipe))
    running = []
    for found in members:
        alive = [member for member in found if next(live) == 1]
        running.append(tuple(member.split(b":", 1)[0] for member in alive))
    return running
