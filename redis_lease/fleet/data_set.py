"""The data set's mark: how a tick tells that the Redis it talks to no longer holds the data
set it wrote to.

``<prefix>:dataset`` (a hash) is made once, by the first tick:

- ``id``: random, written when the mark is made; every job's record keeps a copy
  (``dataset``, written by each of its ticks);
- ``created_at``: when (server clock, ms);
- ``seq``: raised by one on every tick of a job; the tick side remembers the value its
  own last tick got (:mod:`redis_lease.fleet.remembered`, kept outside this data set);
- ``epoch``: the losses noticed in this data set's life;
- ``losses:<kind>``, ``last_loss``, ``last_loss_at``, ``last_loss_reason``: those losses;
  ``replaces``: the id of the data set this one replaced, once a tick noticed.

Each tick of a job first observes the mark (:func:`observe`), against what its side
remembers and the job's copy, in one script, and notices:

- ``replaced``: the tick side remembers another id, or remembers one while the server has
  no mark and no job record keeps one: the server restarted empty, was flushed, or holds
  another server's data;
- ``rolled_back``: the same id, but ``seq`` is below what this side's last tick got: writes
  the tick saw accepted are gone (an older snapshot restored, a failover that missed the
  last writes); a rollback that takes back no tick's write is not seen here;
- ``mark_lost``: no mark while the job's record keeps its id: keys are being dropped
  (eviction, deletion); the mark is made again with that id.

Each loss is counted once, whichever side notices it first: noticing moves the epoch on,
and a side that remembers an older epoch (or the replaced id) takes the new one without
counting again. With nothing remembered and no copy (a new deployment, or a wipe seen by
no tick side) no loss can be told, and none is counted: the job's tick then says it has
"no record of this job's runs" (:mod:`redis_lease.fleet.tick.due_runs`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from ..protocol.connection.clients import as_text
from ..protocol.store.lease_store import LeaseStore
from .remembered import Remembered, keep, recall

#: The kinds of loss the mark tells, in the order the exporter lists them.
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

#: KEYS[1] the mark; ARGV: [1] remembered id ('' none), [2] remembered epoch, [3] remembered
#: seq, [4] the job record's copy of the id ('' none), [5] a new id. Returns {id, epoch, seq
#: (after this tick's), kind noticed now or '', previous id, 1 when a loss happened since
#: what was remembered, created_at}.
_OBSERVE = """
local m = KEYS[1]
local rid, repoch, rseq, copy = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = redis.call('HGET', m, 'id')
local kind, previous, since = '', '', 0
if not id then
  if copy ~= '' then
    id, kind, previous = copy, 'mark_lost', copy
  else
    id = ARGV[5]
    if rid ~= '' then kind, previous = 'replaced', rid end
  end
  redis.call('HSET', m, 'id', id, 'created_at', now, 'epoch', 0, 'seq', 0)
elseif rid ~= '' and id ~= rid then
  if redis.call('HGET', m, 'replaces') == rid then
    since = 1
  else
    kind, previous = 'replaced', rid
  end
elseif rid ~= '' then
  if (redis.call('HGET', m, 'epoch') or '0') ~= repoch then
    since = 1
  elseif tonumber(redis.call('HGET', m, 'seq') or '0') < rseq then
    kind, previous = 'rolled_back', id
  end
end
if kind ~= '' then
  since = 1
  if kind == 'replaced' then redis.call('HSET', m, 'replaces', rid) end
  redis.call('HINCRBY', m, 'epoch', 1)
  redis.call('HINCRBY', m, 'losses:' .. kind, 1)
  redis.call('HSET', m, 'last_loss', kind, 'last_loss_at', now)
end
local seq = redis.call('HINCRBY', m, 'seq', 1)
local epoch = tonumber(redis.call('HGET', m, 'epoch') or '0')
return {id, epoch, seq, kind, previous, since, tonumber(redis.call('HGET', m, 'created_at') or now)}
"""


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
    happened since what the tick side remembers (noticed now or by another side), and
    ``remembered`` what it remembered before this tick.
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
    """Reads and raises the mark for one tick of ``job``, notices a loss against what the
    tick side remembers and the job's copy of the id, and remembers the mark as it is now
    (the runs remembered are kept; the tick replaces them, :func:`remember_runs`)."""
    memory = recall(store)
    script = store.client.register_script(_OBSERVE)
    with store.translating_errors():
        copy = store.client.hget(store.keys.job(job), "dataset")
        args: list[str | int] = [
            memory.id if memory else "",
            memory.epoch if memory else 0,
            memory.seq if memory else 0,
            as_text(copy) if copy else "",
            secrets.token_hex(8),
        ]
        mark_id, epoch, seq, kind, previous, since, created = script(
            keys=[store.keys.data_set], args=args
        )
        loss = None
        if kind:
            text = as_text(kind)
            reason = LOSS_REASONS[text].format(previous=as_text(previous), id=as_text(mark_id))
            loss = Loss(text, reason, as_text(previous))
            store.client.hset(store.keys.data_set, "last_loss_reason", reason)
    seen = Observation(
        as_text(mark_id), int(epoch), int(seq), int(created), loss, bool(since), memory
    )
    runs = memory.runs if memory is not None else {}
    keep(store, Remembered(seen.id, seen.epoch, seen.seq, dict(runs)))
    return seen


def remember_runs(store: LeaseStore, job: str, runs: dict[str, int]) -> None:
    """Remembers ``runs`` (run id -> created ms) as the runs the tick side knows of ``job``
    (``""``: ad-hoc runs), beside the mark last observed."""
    memory = recall(store)
    if memory is not None:
        keep(store, memory.with_runs(job, runs))


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
    "observe",
    "read_mark",
    "remember_runs",
]
