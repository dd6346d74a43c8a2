"""The data set's mark: how a tick detects that the Redis it talks to no longer holds the data
set it wrote to.

``<prefix>:dataset`` (a hash) is made once, by the first tick:

- ``id``: random, written when the mark is made; every job's record keeps a copy
  (``dataset``, written by each of its ticks);
- ``created_at``: when (server clock, ms);
- ``seq``: raised by one on every tick of a job; the scheduler remembers the value its
  own last tick got (:mod:`redis_lease.fleet.loss.tick_memory`, kept outside this data set);
- ``epoch``: the losses noticed in this data set's life;
- ``losses:<kind>``, ``last_loss``, ``last_loss_at``, ``last_loss_reason``: those losses;
  ``replaces``: the id of the data set this one replaced, once a tick noticed.

Each tick of a job first observes the mark (:func:`observe`), against what its scheduler
remembers and the job's copy, in one script (``lua/observe_data_set.lua``), and notices:

- ``replaced``: the scheduler remembers another id, or remembers one while the server has
  no mark and no job record keeps one: the server restarted empty, was flushed, or holds
  another server's data;
- ``rolled_back``: the same id, but ``seq`` is below what this scheduler's last tick got: writes
  the tick saw accepted are gone (an older snapshot restored, a failover that missed the
  last writes); a rollback that takes back no tick's write is not seen here;
- ``mark_lost``: no mark while the job's record keeps its id: keys are being dropped
  (eviction, deletion); the mark is made again with that id.

Each loss is counted once, whichever scheduler notices it first: noticing moves the epoch on,
and a scheduler that remembers an older epoch (or the replaced id) takes the new one without
counting again. With nothing remembered and no copy (a new deployment, or a wipe seen by
no scheduler) no loss can be detected, and none is counted: the job's tick then says it has
"no record of this job's runs" (:mod:`redis_lease.fleet.tick.due_runs`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ...protocol.connection.clients import as_text
from ...protocol.replies import MarkObserved
from ...protocol.store.lease_store import LeaseStore
from .tick_memory import Remembered, keep, keep_in_doubt, recall

#: The kinds of loss the mark detects, in the order the exporter lists them.
LOSS_KINDS = ("replaced", "rolled_back", "mark_lost")
#: What each kind of loss means, for decisions, ``status`` and the run's record.
LOSS_REASONS = {
    "replaced": (
        "the server no longer holds the data set this tick side wrote to (mark {previous} "
        "now {id}): it restarted empty, was flushed or holds another server's data; every "
        "run it held is gone (check persistence: docs/durability.md)"
    ),
    "rolled_back": (
        "the data set went back in time: writes this tick side saw accepted are gone (an "
        "older snapshot restored, or a failover that missed the last writes); work done "
        "since is done again, effects under the same idempotency keys (docs/durability.md)"
    ),
    "mark_lost": (
        "the data set's mark vanished while the job's record kept it: keys are being dropped "
        "(eviction or deletion; check maxmemory-policy: docs/durability.md)"
    ),
}


@dataclass(frozen=True)
class Loss:
    """A loss of data noticed by a tick: its kind (one of :data:`LOSS_KINDS`), what it
    means, and the id of the data set it concerns (the one replaced, or the same)."""

    kind: str
    reason: str
    previous: str


@dataclass(frozen=True)
class Observation:
    """What one tick saw of the mark.

    ``loss`` is the loss this tick noticed (and counted), ``since_loss`` whether a loss
    happened since what the scheduler remembers (noticed now or by another scheduler), and
    ``remembered`` what it remembered before this tick, as far as the tick may use it
    (superseded runs dropped or doubtful: :mod:`redis_lease.fleet.loss.tick_memory`).
    """

    id: str
    epoch: int
    seq: int
    created_at_ms: int
    loss: Loss | None
    since_loss: bool
    remembered: Remembered | None


@dataclass(frozen=True)
class MarkState:
    """The mark as views show it (``status``, the exporter)."""

    id: str
    created_at_ms: int
    epoch: int
    losses: dict[str, int] = field(default_factory=dict)
    last_loss: str = ""
    last_loss_at_ms: int = 0
    last_loss_reason: str = ""


def observe(store: LeaseStore, job: str) -> Observation:
    """Reads and raises the mark for one tick of ``job``, and returns what the tick saw.

    It detects a loss by comparing the mark with what the scheduler remembers and with the
    job's copy of the id. Then it remembers the mark as it is now (the runs remembered are
    kept; the tick replaces them, :func:`remember_runs`)."""
    memory = recall(store)
    with store.translating_errors():
        copy = store.client.hget(store.keys.job(job), "dataset")
        args: list[str | int] = [
            memory.id if memory else "",
            memory.epoch if memory else 0,
            memory.seq if memory else 0,
            as_text(copy) if copy else "",
            secrets.token_hex(8),
        ]
        mark: MarkObserved = store.scripts.call("observe_data_set", [store.keys.data_set], args)
        loss = None
        if mark.kind:
            reason = LOSS_REASONS[mark.kind].format(previous=mark.previous, id=mark.id)
            loss = Loss(mark.kind, reason, mark.previous)
            store.client.hset(store.keys.data_set, "last_loss_reason", reason)
    current = _judged(memory, mark, loss, job)
    seen = Observation(
        mark.id, mark.epoch, mark.seq, mark.created_at_ms, loss, mark.since_loss, current
    )
    kept = Remembered(seen.id, seen.epoch, seen.seq)
    if current is not None:
        kept = replace(current, id=seen.id, epoch=seen.epoch, seq=seen.seq)
    keep(store, kept)
    return seen


def _judged(
    memory: Remembered | None, mark: MarkObserved, loss: Loss | None, mark_job: str
) -> Remembered | None:
    """Returns the part of ``memory`` this tick may use (:mod:`redis_lease.fleet.loss.tick_memory`).

    All of it, when this tick noticed a loss now or no other scheduler ticked since the
    memory was written. Its runs and scheduled times are marked doubtful when another
    scheduler noticed a loss first or ticked since (or when this scheduler's own tick lost
    its reply: it cannot tell which). While nothing is lost the server's records are the
    truth, and after a loss a doubtful run is only named. After a loss, every job the memory
    knows of (and ``mark_job``) is listed in ``unsettled`` until its tick finishes
    (:func:`remember_runs`)."""
    if memory is None:
        return memory
    if loss is not None:
        return memory.after_loss(mark_job)
    if mark.since_loss:
        return memory.doubted().after_loss(mark_job)
    if mark.seq - 1 != memory.seq:
        return memory.doubted()
    return memory


def remember_runs(
    store: LeaseStore, job: str, runs: dict[str, int], fired_ms: int | None = None
) -> None:
    """Remembers ``runs`` (run id -> created ms) as the runs the scheduler knows of ``job``
    (``""``: ad-hoc runs), and ``fired_ms`` as the last scheduled time its ticks handled,
    beside the mark last observed. It also removes ``job`` from ``unsettled``: its tick
    after a loss has finished."""
    memory = recall(store)
    if memory is not None:
        memory = memory.with_runs(job, runs).settled(job)
        keep(store, memory if fired_ms is None else memory.with_fired(job, fired_ms))


def mirror(store: LeaseStore, jobs: Sequence[str]) -> None:
    """Keeps in this process a doubtful copy of what the server holds of ``jobs``.

    The copy holds the mark, and each job's open runs and last scheduled time handled (one
    round trip). A worker that may lead next does this while another worker leads. So
    whichever worker takes the lease after a wipe can detect the loss and name the runs it
    took. It never makes those runs again on this copy alone: it does not know which of
    them ended since. Nothing is kept while the server has no mark."""
    with store.translating_errors():
        pipe = store.client.pipeline(transaction=False)
        pipe.hmget(store.keys.data_set, ["id", "epoch", "seq"])
        for job in jobs:
            pipe.smembers(store.keys.job_open_runs(job))
            pipe.hget(store.keys.job(job), "last_fire_at")
        (mark_id, epoch, seq), *per_job = pipe.execute()
    if not mark_id:
        return
    memory = Remembered(as_text(mark_id), int(epoch or 0), int(seq or 0))
    for job, open_runs, fired in zip(jobs, per_job[::2], per_job[1::2], strict=True):
        memory = memory.with_runs(job, dict.fromkeys(map(as_text, open_runs), 0))
        memory = memory if fired is None else memory.with_fired(job, int(fired))
    keep_in_doubt(store, memory.doubted())


def read_mark(store: LeaseStore) -> MarkState | None:
    """The mark as it is, or None when the server has none (no tick has run, or it is lost)."""
    with store.translating_errors():
        raw = store.client.hgetall(store.keys.data_set)
    fields = {as_text(k): as_text(v) for k, v in raw.items()}
    if not fields.get("id"):
        return None

    def number(name: str) -> int:
        text = fields.get(name, "")
        return int(text) if text.isdigit() else 0

    return MarkState(
        fields["id"],
        number("created_at"),
        number("epoch"),
        {kind: number(f"losses:{kind}") for kind in LOSS_KINDS},
        fields.get("last_loss", ""),
        number("last_loss_at"),
        fields.get("last_loss_reason", ""),
    )


__all__ = [
    "LOSS_KINDS",
    "LOSS_REASONS",
    "Loss",
    "MarkState",
    "Observation",
    "mirror",
    "observe",
    "read_mark",
    "remember_runs",
]
