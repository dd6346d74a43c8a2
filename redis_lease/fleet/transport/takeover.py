"""Taking over the work of a shard job that stopped, judged by the server's clock alone.

A shard job registers in the registry (:attr:`~redis_lease.protocol.keys.Keys.shard_job_registry`:
who runs it: worker, lease owner, host, pid; what: job path, queue, budget) as its work
starts (``register_shard_job.lua``). Its lease keeper sends a heartbeat every
:data:`~redis_lease.limits.HEARTBEAT` second from a thread of its own. A script stores each
heartbeat with the server's time (``shard_job_beat.lua``). A job is **dead** when the
server's clock says both

- it has sent no heartbeat for :data:`~redis_lease.limits.DEAD_AFTER` seconds, and
- :data:`~redis_lease.limits.DEAD_AFTER` seconds have passed since the last stall ended.

A stall is a gap of more than :data:`~redis_lease.limits.STALL_GAP_MS` between two calls of
the registry's scripts (the fleet's clock, ``lua/include/fleet_clock.lua``). Every worker
calls one each second and every job sends a heartbeat each second, so such a gap means
nobody reached Redis: it stalled (a fork, a long script), failed over, or every worker was
cut off. After a stall, every live job gets a full dead-after period to send a heartbeat
again; a job killed long before is taken over once that period ends. A worker cut off from
Redis alone is taken over (it cannot commit anyway: its leases' fence refuses it). Its shard
job, once it reaches Redis again, finds its registration gone and stops. A slow handler
that lets Python run its threads keeps sending heartbeats and is never taken over. No
worker's own clock takes part.

Whoever sees a dead shard job first takes it over, once (``take_shard_jobs.lua`` decides
who): every ``redis-lease worker`` looks every second
(:class:`~redis_lease.fleet.worker.watch.FleetWatch`, one script call whatever the number of
jobs), and the tick looks too (:func:`~redis_lease.fleet.transport.shard_jobs.live_jobs`). A
worker never takes over a shard job of its own process or of its own worker (:func:`runs_here`).
Taking over:

1. ends the job's leases now, by the server clock (``cut_leases.lua``, every lease of its
   owner in the shard): the next claim takes each item over with a new token, and the old
   holder, if it was only paused, is refused when it wakes (fencing);
2. forgets the job, then counts it failed on its run (``status`` shows it), and records the
   takeover in the run's decisions and in the fleet's takeover log (``redis-lease workers``).

Each step is safe to repeat. If the worker taking over dies between them, the takeover
stays begun, and another worker takes it again :data:`~redis_lease.limits.TAKEOVER_RETRY_MS`
later. The worker that took it over then enqueues a shard job for the shard at the front of
its queue, so that an idle worker takes the items at once.

Each heartbeat also sets its value (the process id, the leases it holds) in a key that lives
:data:`~redis_lease.limits.DEAD_AFTER` seconds (:meth:`~redis_lease.protocol.keys.Keys.run_beat`):
the views show it, and a tick of 0.9.0 counts a started shard job live while it exists.
It decides nothing here.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

from redis.exceptions import NoScriptError

from ...errors import InvalidInput, NotFound, RedisLeaseError
from ...limits import (
    DAY_MS,
    DEAD_AFTER_MS,
    SHARD_COUNT_MAX,
    STALL_GAP_MS,
    TAKEOVER_LOG_CAP,
    TAKEOVER_RETRY_MS,
    WORKER_NAME_MAX,
)
from ...messages import count_of
from ...protocol.connection.clients import as_text, queue_time, time_ms
from ...protocol.replies import Swept
from ...protocol.scripts import Call, Command
from ...protocol.store.declared_jobs import is_job_path
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import check_id, clip
from ..runs.lifecycle import Runs
from .shard_job_failures import record_job_failure

log = logging.getLogger("redis_lease.worker")

#: Takeovers kept in the fleet's takeover log (newest first).
TAKEOVER_LOG = TAKEOVER_LOG_CAP
#: Milliseconds a takeover, and a silent worker's record, stay in the views: a day.
KEPT_MS = DAY_MS
#: Why a shard job is taken over when nothing more is known.
STOPPED = "stopped beating: killed, paused or cut off from Redis"
#: The most dead jobs (and unfinished takeovers) one sweep returns.
SWEEP_LIMIT = 100


@dataclass(frozen=True)
class ShardJob:
    """A shard job at work, as it registered.

    Attributes:
        rq_id: its RQ job id.
        run_id: the run it works.
        shard: the shard it works.
        worker: the RQ worker running it (its ``--name``).
        owner: the lease owner its claims name (host, process, job).
        host: the machine's name.
        pid: the process running the shard loop.
        path: the job's import path (``package.module:attr``).
        queue: the RQ queue it came from.
        budget: its time budget in seconds.
    """

    rq_id: str
    run_id: str
    shard: int
    worker: str
    owner: str
    host: str
    pid: int
    path: str
    queue: str
    budget: float

    def to_json(self) -> str:
        """The registry's text of this job (its RQ id is the field's name)."""
        fields = asdict(self)
        del fields["rq_id"]
        return json.dumps(fields, separators=(",", ":"))

    @classmethod
    def from_json(cls, rq_id: str, raw: Any) -> ShardJob | None:
        """The job registered as ``raw`` under ``rq_id``; None when it cannot be read
        (anyone who can write the key may have written anything there)."""
        try:
            data = json.loads(as_text(raw))
            job = cls(
                rq_id=check_id(rq_id, "RQ job id"),
                run_id=check_id(str(data["run_id"]), "run id"),
                shard=int(data["shard"]),
                worker=clip(str(data["worker"]), WORKER_NAME_MAX),
                owner=check_id(str(data["owner"]), "owner"),
                host=clip(str(data["host"]), WORKER_NAME_MAX),
                pid=int(data["pid"]),
                path=str(data["path"]),
                queue=check_id(str(data["queue"]), "queue"),
                budget=float(data["budget"]),
            )
        except (ValueError, TypeError, KeyError, InvalidInput, UnicodeDecodeError):
            return None
        well_formed = is_job_path(job.path) and 0 <= job.shard < SHARD_COUNT_MAX
        return job if well_formed and job.budget > 0 else None


@dataclass(frozen=True)
class Takeover:
    """One stopped shard job taken over.

    Attributes:
        job: the shard job, as it registered.
        leases: its leases ended early (their items claimable now).
        at_ms: when, server clock.
    """

    job: ShardJob
    leases: int
    at_ms: int

    def line(self) -> str:
        """The takeover in one line, for logs and the worker's output."""
        job = self.job
        return (
            f"took over run {job.run_id} shard {job.shard} from worker {job.worker!r} "
            f"(host {job.host!r}, pid {job.pid}): its heartbeat stopped; "
            f"{count_of(self.leases, 'lease')} ended, their items claimable now"
        )


@dataclass(frozen=True)
class Registered:
    """A registered shard job as the views show it.

    Attributes:
        key: the entry's field as stored.
        job: the entry read, None when it cannot be read.
        beat: what its last beat said (``pid``, ``held``) while that lives, else None.
        beat_ms: its last beat (server ms); None once its takeover has begun.
        beating: alive by the rule of the module.
        taking: a takeover of it has begun.
    """

    key: bytes
    job: ShardJob | None
    beat: dict[str, Any] | None
    beat_ms: int | None = None
    beating: bool = False
    taking: bool = False


#: The RQ worker names of this process (its :class:`~redis_lease.fleet.worker.watch.FleetWatch`
#: adds its own): a worker of this process never takes over their shard jobs.
OWN_WORKERS: set[str] = set()


def runs_here(job: ShardJob) -> bool:
    """True when ``job`` is this process's, or its worker's (an RQ worker of this process)
    and its process still runs: a worker here never takes it over. A worker's work horse
    that died (gone, or a zombie) is not its own any more: another worker, or the tick,
    may take it over."""
    if job.host != clip(socket.gethostname(), WORKER_NAME_MAX):
        return False
    if job.pid == os.getpid():
        return True
    return job.worker in OWN_WORKERS and _process_runs(job.pid)


def _process_runs(pid: int) -> bool:
    """True when process ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def register(store: LeaseStore, job: ShardJob, said: str) -> None:
    """Registers a shard job with its first beat (``register_shard_job.lua``), and sets
    ``said``, what its beats say, in the key the views and a tick of 0.9.0 read
    (:meth:`~redis_lease.protocol.keys.Keys.run_beat`), in one round trip."""
    calls: list[Call | Command] = [
        Command(("SET", store.keys.run_beat(job.run_id, job.rq_id), said, "PX", DEAD_AFTER_MS)),
        Call(
            "register_shard_job",
            store.keys.shard_job_registry,
            [job.rq_id, "register", job.to_json(), STALL_GAP_MS],
        ),
    ]
    with store.translating_errors(job.run_id):
        _said, reply = store.scripts.many(calls)
    if isinstance(reply, Exception):
        raise store.translating_errors(job.run_id).error(reply)


def unregister(store: LeaseStore, job_id: str) -> bool:
    """Takes a shard job that ends out of the registry; False when it was not there (taken
    over, or never registered)."""
    with store.translating_errors():
        registered_before, _now = store.scripts.call(
            "register_shard_job",
            store.keys.shard_job_registry,
            [job_id, "unregister", "", STALL_GAP_MS],
        )
    return bool(registered_before)


def beat_command(store: LeaseStore, job_id: str) -> Command:
    """The registry's beat of shard job ``job_id`` as a plain ``EVALSHA`` to send with other
    commands; its raw reply is ``[registered, now ms]`` (see :func:`beat_reply`)."""
    script = store.scripts["shard_job_beat"]
    _entries, beats, _taking, clock = store.keys.shard_job_registry
    return Command(("EVALSHA", script.sha, 2, beats, clock, job_id, STALL_GAP_MS))


def beat_reply(store: LeaseStore, reply: Any) -> bool | None:
    """Whether the job is still registered, from a :func:`beat_command`'s raw reply; None when
    the server answered no beat (it lost the script, which is loaded again for the next)."""
    if isinstance(reply, NoScriptError):
        with store.translating_errors():
            store.client.script_load(store.scripts["shard_job_beat"].script)
        return None
    if isinstance(reply, Exception):
        raise store.translating_errors().error(reply)
    return bool(reply[0])


def registered(store: LeaseStore) -> list[Registered]:
    """Every registered shard job, with its beat (two round trips)."""
    entries_key, beats_key, taking_key, clock_key = store.keys.shard_job_registry
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.hgetall(entries_key)
        pipe.zrange(beats_key, 0, -1, withscores=True)
        pipe.zrange(taking_key, 0, -1)
        pipe.hget(clock_key, "stall_end_ms")
        queue_time(pipe)
        entries, beats_raw, taking_raw, stall_raw, now = pipe.execute()
        now_ms = time_ms(now)
        stall_end = int(stall_raw) if stall_raw is not None else 0
        beats = {_raw(key): int(score) for key, score in beats_raw}
        taking = {_raw(key) for key in taking_raw}
        found = [(_raw(key), _job(_raw(key), raw)) for key, raw in entries.items()]
        pipe = store.client.pipeline(transaction=False)
        readable = [job for _, job in found if job is not None]
        for each in readable:
            pipe.get(store.keys.run_beat(each.run_id, each.rq_id))
        said = dict(zip((each.rq_id for each in readable), pipe.execute(), strict=True))
    rows = []
    for key, job in found:
        beat = _beat(said.get(job.rq_id)) if job is not None else None
        beat_ms = beats.get(key)
        beating = beat_ms is not None and not _dead(beat_ms, now_ms, stall_end)
        rows.append(Registered(key, job, beat, beat_ms, beating, key in taking))
    return rows


def _dead(beat_ms: int, now_ms: int, stall_end_ms: int) -> bool:
    """The rule of ``lua/include/fleet_clock.lua`` (``beat_dead``), for the views."""
    return now_ms - stall_end_ms >= DEAD_AFTER_MS and beat_ms < now_ms - DEAD_AFTER_MS


def _raw(key: bytes | str) -> bytes:
    return key if isinstance(key, bytes) else key.encode()


def _job(key: bytes, raw: Any) -> ShardJob | None:
    try:
        return ShardJob.from_json(key.decode(), raw)
    except UnicodeDecodeError:
        return None


def _beat(raw: Any) -> dict[str, Any] | None:
    """What a beat said; ``{}`` for a beat of an earlier version (the pid alone)."""
    if raw is None:
        return None
    try:
        said = json.loads(as_text(raw))
    except (ValueError, UnicodeDecodeError):
        return {}
    return said if isinstance(said, dict) else {}


def look(store: LeaseStore, limit: int = SWEEP_LIMIT) -> Swept:
    """One look at the registry (``sweep_shard_jobs.lua``): the dead jobs and the
    takeovers left unfinished, at most ``limit`` of each."""
    with store.translating_errors():
        swept: Swept = store.scripts.call(*look_call(store, limit))
    return swept


def look_call(store: LeaseStore, limit: int = SWEEP_LIMIT) -> Call:
    """:func:`look` as a call to send with others
    (:meth:`~redis_lease.protocol.scripts.Scripts.many`)."""
    return Call(
        "sweep_shard_jobs",
        store.keys.shard_job_registry,
        [DEAD_AFTER_MS, STALL_GAP_MS, limit, TAKEOVER_RETRY_MS],
    )


def _take(store: LeaseStore, what: str, ids: Sequence[str]) -> list[str]:
    """Runs ``take_shard_jobs.lua`` (``take`` or ``done``) on ``ids``; the ids it did it to."""
    if not ids:
        return []
    with store.translating_errors():
        _now, done = store.scripts.call(
            "take_shard_jobs",
            store.keys.shard_job_registry,
            [what, DEAD_AFTER_MS, STALL_GAP_MS, TAKEOVER_RETRY_MS, *ids],
        )
    return list(done)


def take_over(
    store: LeaseStore, job: ShardJob, why: str = STOPPED, *, known_dead: bool = False
) -> Takeover | None:
    """Takes over a registered shard job if it is dead by the rule of the module (or its
    takeover was left unfinished; or ``known_dead``: its process is known to be gone, as RQ
    saw its work horse die): ends its leases, forgets it, counts it failed with ``why``,
    records it.

    Returns None when it is alive, or another worker took it over first.
    """
    if not _take(store, "take_dead" if known_dead else "take", [job.rq_id]):
        return None
    return _finish(store, job, why, partial(_done, store, job.rq_id))


def _done(store: LeaseStore, rq_id: str) -> bool:
    """Forgets a job taken over; False when another worker finished it meanwhile."""
    return bool(_take(store, "done", [rq_id]))


def _finish(
    store: LeaseStore, job: ShardJob, why: str, forget: Callable[[], bool]
) -> Takeover | None:
    """The takeover's steps once it is won: the leases cut, the job forgotten (``forget``;
    False: another finished it meanwhile), then counted and recorded, once."""
    try:
        cut = store.cut_leases(job.run_id, job.shard, job.owner)
    except NotFound:  # the run is gone: nothing to take over
        forget()
        return None
    with store.translating_errors(job.run_id):
        pipe = store.client.pipeline(transaction=False)
        pipe.hdel(store.keys.run_jobs(job.run_id), job.rq_id)
        pipe.delete(store.keys.run_beat(job.run_id, job.rq_id))
        pipe.execute()
    if not forget():
        return None
    done = Takeover(job, cut.leases, cut.now_ms)
    _record(store, done, why)
    return done


def _record(store: LeaseStore, done: Takeover, why: str) -> None:
    """Counts the takeover on the run and logs it in the run's decisions and the fleet's
    takeover log (best effort: logged when Redis refuses)."""
    job = done.job
    error = f"{why}; worker {job.worker}, {count_of(done.leases, 'lease')} of it taken over"
    try:
        record_job_failure(store, job.run_id, job.shard, error)
        Runs(store).record_decision(job.run_id, "takeover", done.line())
        entry = {**asdict(job), "leases": done.leases, "at_ms": done.at_ms}
        with store.translating_errors(job.run_id):
            pipe = store.client.pipeline(transaction=False)
            pipe.lpush(store.keys.takeovers, json.dumps(entry, separators=(",", ":")))
            pipe.ltrim(store.keys.takeovers, 0, TAKEOVER_LOG - 1)
            pipe.pexpire(store.keys.takeovers, KEPT_MS)
            pipe.execute()
    except RedisLeaseError as error:
        log.warning("could not record the takeover of run %r: %s", job.run_id, error)


def takeovers(store: LeaseStore, count: int = TAKEOVER_LOG) -> list[dict[str, Any]]:
    """The newest takeovers, newest first (the entries that can be read)."""
    with store.translating_errors():
        raws = store.client.lrange(store.keys.takeovers, 0, count - 1)
    found = []
    for raw in raws:
        try:
            entry = json.loads(as_text(raw))
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(entry, dict):
            found.append(entry)
    return found


def sweep(
    store: LeaseStore,
    why: Callable[[ShardJob], str] = lambda job: STOPPED,
    swept: Swept | None = None,
) -> list[Takeover]:
    """Takes over every registered shard job that is dead by the rule of the module, and
    every takeover left unfinished, but none that :func:`runs_here` (``why``: what is
    known of its end; ``swept``: a :func:`look` already made). Entries nobody can read are
    forgotten. Returns the takeovers made.

    One script call when nothing is dead, whatever the number of registered jobs.
    """
    swept = look(store) if swept is None else swept
    jobs: dict[str, ShardJob] = {}
    unreadable: list[str] = []
    for found in [*swept.dead, *swept.stuck]:
        job = _job(found.rq_id.encode(), found.entry) if found.entry else None
        if job is None:
            unreadable.append(found.rq_id)
        elif runs_here(job):
            log.warning(
                "shard job %s of run %r has not beaten for %.1f s, but runs here: not taken over",
                job.rq_id,
                job.run_id,
                (swept.now_ms - found.at_ms) / 1000,
            )
        else:
            jobs[job.rq_id] = job
    if unreadable:
        log.warning("dropping %d unreadable shard job entries", len(unreadable))
        _take(store, "done", _take(store, "take", unreadable))
    done: list[Takeover] = []
    for rq_id in _take(store, "take", list(jobs)):
        job = jobs[rq_id]
        taken = _finish(store, job, why(job), partial(_done, store, rq_id))
        if taken is not None:
            done.append(taken)
    return done
