"""The jobs each worker given jobs declared, and what the tick leader says of the ones it
does not tick: so that a job only some workers were given is ticked, or named.

Every worker process given jobs (``redis-lease worker --job``) declares them, by name and
import path, with each of its tries for the tick leader's lease (:func:`declare_jobs`,
``declare_jobs.lua``: kept at the server's time, dropped once not renewed for
:data:`~redis_lease.limits.TICK_DECLARED_MS`). The leader ticks its own jobs and every
declared job it finds in the code it has loaded; it keeps, beside its lease, the list of the
declared jobs it does not tick and why (:func:`unticked_text`, sent with its renewals through
``tick_leader.lua``). :func:`declared_jobs` joins the two for people: ``redis-lease
workers``, the metrics.

Anything a worker wrote may be hostile: a declaration is read as data only (a job name that
is an id, a path of Python names, text cut to a bound), and one that is not is skipped.
Nothing read here is imported or run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeGuard

from ...limits import ID_MAX_LENGTH, TICK_DECLARED_MS, WORKER_NAME_MAX
from ..connection.clients import queue_time, time_ms
from ..validation import ID_PATTERN, clip
from .leader import shown_holder
from .store_client import StoreBase

#: The most jobs one declaration holds, and declared jobs the leader names unticked, that
#: are read (more are skipped).
JOBS_MAX = 100
#: The longest reason kept or shown, in UTF-8 bytes (a worker's name: WORKER_NAME_MAX).
REASON_MAX = 500
#: The most workers named for one job the leader does not tick.
WORKERS_MAX = 10
#: The longest declaration or leader's list written, in characters of JSON (ASCII): well
#: under the scripts' bound (json_bytes, counted as escaped inside a JSON string), so that
#: neither a long job list nor a crowded fleet ever gets a declaration or a renewal refused.
WRITTEN_MAX = 16_000


@dataclass(frozen=True)
class Declaration:
    """One worker process's declared jobs, as read.

    Attributes:
        holder: the process's id (as in the tick leader's lease).
        worker: its worker's name.
        jobs: job name -> import path.
        seen_ms: when it last declared them (server ms).
    """

    holder: str
    worker: str
    jobs: dict[str, str]
    seen_ms: int


@dataclass(frozen=True)
class Unticked:
    """A declared job the tick leader does not tick, and why.

    Attributes:
        job: the job's name.
        path: its import path, as declared.
        workers: the workers that declared it.
        reason: why the leader does not tick it.
    """

    job: str
    path: str
    workers: tuple[str, ...]
    reason: str


@dataclass
class DeclaredJob:
    """A job a live worker declared, as people see it.

    Attributes:
        job: the job's name.
        path: its import path (the first one declared, when several were).
        workers: the workers that declared it.
        ticked: whether the tick leader ticks it (False when no worker leads).
        reason: why it is not ticked ('' when it is).
    """

    job: str
    path: str
    workers: list[str] = field(default_factory=list)
    ticked: bool = True
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The job as JSON-ready data."""
        return asdict(self)


@dataclass
class FleetJobs:
    """The tick leader and the jobs the live workers declared.

    Attributes:
        leader: the name of the worker holding a live tick leader's lease ('' for none).
        token: the lease's token (0 before any).
        jobs: every job a live worker declared, by name.
        since_ms: when the leader took the lease, on the server's clock (0 for none, or a
            lease an earlier release took, which kept no such time).
    """

    leader: str = ""
    token: int = 0
    jobs: dict[str, DeclaredJob] = field(default_factory=dict)
    since_ms: int = 0

    @property
    def unticked(self) -> list[DeclaredJob]:
        """The declared jobs no leader ticks, by name."""
        return [job for _, job in sorted(self.jobs.items()) if not job.ticked]


def declaration_text(worker: str, jobs: Mapping[str, str]) -> str:
    """What a worker declares: its name and its jobs (name -> path), as JSON; the jobs past
    :data:`JOBS_MAX`, or past :data:`WRITTEN_MAX` characters, are left out."""
    kept = dict(sorted(jobs.items())[:JOBS_MAX])
    while True:
        text = json.dumps({"worker": clip(worker, WORKER_NAME_MAX), "jobs": kept}, sort_keys=True)
        if len(text) <= WRITTEN_MAX or not kept:
            return text
        kept.popitem()


def declare_jobs(
    store: StoreBase,
    holder: str,
    worker: str,
    jobs: Mapping[str, str],
    kept_ms: int = TICK_DECLARED_MS,
) -> list[Unticked] | None:
    """Declares (or renews) the jobs of process ``holder`` of worker ``worker``: job name ->
    import path. Returns what the live tick leader says of the declared jobs it does not
    tick (every worker's, not only these; each reason names the leader), None when no
    worker holds a live lease."""
    with store.translating_errors():
        store.scripts.call(
            "declare_jobs",
            store.keys.tick_declared,
            [holder, declaration_text(worker, jobs), kept_ms],
        )
        pipe = store.client.pipeline(transaction=False)
        pipe.hmget(store.keys.tick_leader, ["holder", "token", "expires", "unticked"])
        queue_time(pipe)
        (lease_holder, token, expires, said), now = pipe.execute()
    if not lease_holder or _number(expires) <= time_ms(now):
        return None
    holder_text = _text(lease_holder)
    leader = f"the tick leader {shown_holder(holder_text)}: "
    found = read_unticked(said, holder_text, _number(token))
    return [replace(u, reason=leader + u.reason) for u in found]


def withdraw_jobs(store: StoreBase, holder: str, kept_ms: int = TICK_DECLARED_MS) -> None:
    """Withdraws the declaration of process ``holder`` (its worker stops)."""
    with store.translating_errors():
        store.scripts.call("declare_jobs", store.keys.tick_declared, [holder, "", kept_ms])


def declarations(store: StoreBase, kept_ms: int = TICK_DECLARED_MS) -> list[Declaration]:
    """The declarations renewed within ``kept_ms`` (server clock), each checked as it is read;
    by process id."""
    found, _now = _read_declarations(store, kept_ms)
    return found


def _read_declarations(store: StoreBase, kept_ms: int) -> tuple[list[Declaration], int]:
    declared_key, seen_key = store.keys.tick_declared
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.hgetall(declared_key)
        pipe.zrange(seen_key, 0, -1, withscores=True)
        queue_time(pipe)
        records, seen, now = pipe.execute()
    now_ms = time_ms(now)
    found = []
    for raw_holder, score in seen:
        if now_ms - score > kept_ms:
            continue
        holder = _text(raw_holder)
        read = _declaration(holder, records.get(raw_holder), int(score))
        if read is not None:
            found.append(read)
    return sorted(found, key=lambda d: d.holder), now_ms


def _declaration(holder: str, raw: Any, seen_ms: int) -> Declaration | None:
    """A declaration read, or None when it is not one."""
    data = _json(raw)
    if not isinstance(data, dict) or not isinstance(data.get("jobs"), dict):
        return None
    worker = data.get("worker")
    jobs = {
        name: path
        for name, path in list(data["jobs"].items())[:JOBS_MAX]
        if _job_name(name) and is_job_path(path)
    }
    shown = clip(worker, WORKER_NAME_MAX) if isinstance(worker, str) else shown_holder(holder)
    return Declaration(holder, shown, jobs, seen_ms) if jobs else None


def is_job_path(path: Any) -> TypeGuard[str]:
    """Whether ``path`` has the form of a job's import path: ``package.module:attr``, each
    part a Python name, at most the length of an id."""
    if not isinstance(path, str) or len(path) > ID_MAX_LENGTH:
        return False
    module, colon, attr = path.partition(":")
    parts = module.split(".")
    return bool(colon) and attr.isidentifier() and all(part.isidentifier() for part in parts)


def unticked_text(holder: str, token: int, unticked: list[Unticked]) -> str:
    """What a leader says of the declared jobs it does not tick, as it keeps it beside its
    lease: its holder and token (so that no other leadership's list is taken for it) and
    each job (at most :data:`JOBS_MAX`, each naming at most :data:`WORKERS_MAX` workers;
    the jobs past :data:`WRITTEN_MAX` characters are left out)."""
    jobs = [
        {
            "job": u.job,
            "path": u.path,
            "workers": [clip(w, WORKER_NAME_MAX) for w in u.workers[:WORKERS_MAX]],
            "reason": clip(u.reason, REASON_MAX),
        }
        for u in unticked[:JOBS_MAX]
    ]
    while True:
        text = json.dumps({"holder": holder, "token": token, "jobs": jobs}, sort_keys=True)
        if len(text) <= WRITTEN_MAX or not jobs:
            return text
        jobs.pop()


def read_unticked(raw: Any, holder: str, token: int) -> list[Unticked]:
    """The list a leader kept beside its lease (:func:`unticked_text`), when it is the list of
    the lease's ``holder`` and ``token``; [] otherwise or when it is not one."""
    data = _json(raw)
    if not isinstance(data, dict) or data.get("holder") != holder or data.get("token") != token:
        return []
    entries = data.get("jobs")
    found = []
    for entry in entries[:JOBS_MAX] if isinstance(entries, list) else []:
        if not isinstance(entry, dict):
            continue
        job, path, workers, reason = (entry.get(k) for k in ("job", "path", "workers", "reason"))
        if not (_job_name(job) and is_job_path(path) and isinstance(reason, str)):
            continue
        listed = workers[:JOBS_MAX] if isinstance(workers, list) else []
        names = tuple(clip(w, WORKER_NAME_MAX) for w in listed if isinstance(w, str))
        found.append(Unticked(job, path, names, clip(reason, REASON_MAX)))
    return found


def declared_jobs(store: StoreBase, kept_ms: int = TICK_DECLARED_MS) -> FleetJobs:
    """The tick leader and every job a live worker declared, each with whether the leader
    ticks it: not when no worker holds a live lease, nor when the leader names it."""
    found, now_ms = _read_declarations(store, kept_ms)
    with store.translating_errors():
        holder, token, expires, said, since = store.client.hmget(
            store.keys.tick_leader, ["holder", "token", "expires", "unticked", "since"]
        )
    live = bool(holder) and _number(expires) > now_ms
    fleet = FleetJobs(shown_holder(_text(holder)) if live else "", _number(token))
    fleet.since_ms = _number(since) if live else 0
    for declaration in found:
        for name, path in sorted(declaration.jobs.items()):
            job = fleet.jobs.setdefault(name, DeclaredJob(name, path))
            if declaration.worker not in job.workers:
                job.workers.append(declaration.worker)
    if not live:
        for job in fleet.jobs.values():
            job.ticked, job.reason = False, "no worker holds the tick leader's lease"
        return fleet
    for entry in read_unticked(said, _text(holder), fleet.token):
        if entry.job in fleet.jobs:
            job = fleet.jobs[entry.job]
            job.ticked, job.reason = False, f"the tick leader {fleet.leader}: {entry.reason}"
    return fleet


def _job_name(name: Any) -> TypeGuard[str]:
    return isinstance(name, str) and ID_PATTERN.fullmatch(name) is not None


def _text(raw: Any) -> str:
    """Bytes from Redis as text, undecodable bytes replaced (a worker may write anything)."""
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw or "")


def _number(raw: Any) -> int:
    text = _text(raw)
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 15 else 0


def _json(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(_text(raw))
    except (ValueError, RecursionError):
        return None
