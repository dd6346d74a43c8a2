"""What the scheduler remembers of the data set it wrote to.

The scheduler is the process that runs the ticks: the fleet's leader, or
``redis-lease tick`` from cron. It keeps this memory where a loss of the lease store's
Redis cannot reach it.

A tick remembers the data set's mark (:mod:`redis_lease.fleet.loss.data_set_mark`: its id, its
epoch and the sequence number the tick's own last write got) and the runs it knew of (each job's
open runs, the newest ad-hoc runs), so that after a loss it can tell that the server's data set is
not the one it wrote to, and which runs went with it. Three places keep it, none of them the
lease store's data set:

- the process: each store object remembers what its ticks saw (a long-lived ticking
  process, a worker running ``tick_entry`` in-process, a test);
- a file, when ``REDIS_LEASE_MARK_FILE`` names one (for ticks from system cron, each a new
  process): one entry per server and prefix, replaced whole on each write;
- RQ's Redis, when it is apart from the lease store's (``--queue-url``):
  ``<prefix>:dataset:remembered`` there.

:func:`recall` returns the first of them that has an entry (in that order); :func:`keep`
writes all of them. Losing the memory itself loses nothing but the power to tell a wiped
server from a new one (see docs/durability.md).

A memory is only as good as it is current. Each remembered run has a state:

- ``open``: seen open by this scheduler's last tick of its job;
- ``creating``: this scheduler was making it (written before the run is created);
- ``ending``: this scheduler was ending it (written before its final state is);
- ``doubtful``: remembered by a scheduler that another may have superseded since.

After a loss, a run remembered ``open`` or ``creating`` may be made again (where its job's
schedule covers it); one remembered ``ending`` or ``doubtful`` is only named lost: it may
have ended. While nothing is lost, the server's records are the truth: a ``creating`` or
``doubtful`` run is not looked for. A memory becomes doubtful when another scheduler ticked
after it (the mark's ``seq`` moved past the one it remembers), when another scheduler noticed a
loss first, and when the tick leader holding it had a break in its leadership
(:func:`distrust`: another leader may have ticked meanwhile).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary, WeakSet

import redis

from ...errors import InvalidInput
from ...protocol.connection.clients import as_text
from ...protocol.connection.urls import safe_url
from ...protocol.store.lease_store import LeaseStore

log = logging.getLogger("redis_lease.fleet.loss.tick_memory")

#: The environment variable naming the memory file of ticks that run as new processes.
MARK_FILE_ENV = "REDIS_LEASE_MARK_FILE"
#: The most runs remembered per server and prefix (the newest are kept).
RUNS_REMEMBERED = 500

_by_store: WeakKeyDictionary[LeaseStore, Remembered] = WeakKeyDictionary()
#: The stores whose process memory is in doubt and was not written since (:func:`distrust`).
_doubted: WeakSet[LeaseStore] = WeakSet()


#: What a remembered run's entry says (see the module's docstring).
OPEN, CREATING, ENDING, DOUBTFUL = "open", "creating", "ending", "doubtful"
#: The states whose run may be made again after a loss.
MAY_BE_OPEN = (OPEN, CREATING)


@dataclass(frozen=True)
class Remembered:
    """A data set's mark as the scheduler last saw it, and the runs it knew of.

    ``runs`` maps a run id to its job (``""`` for an ad-hoc run) and when it was created
    (ms, 0 when not known); ``states`` a run id to its state when it is not ``open``;
    ``fired`` a job to the last scheduled time its ticks handled (ms) and whether that is
    doubtful (after a loss it tells which dates had their run, when the server cannot);
    ``unsettled`` the jobs whose first tick after a loss (noticed by this scheduler) has not
    finished yet.
    """

    id: str
    epoch: int
    seq: int
    runs: dict[str, tuple[str, int]] = field(default_factory=dict)
    states: dict[str, str] = field(default_factory=dict)
    fired: dict[str, tuple[int, bool]] = field(default_factory=dict)
    unsettled: frozenset[str] = frozenset()

    def with_runs(self, job: str, runs: dict[str, int]) -> Remembered:
        """This memory with ``job``'s runs replaced by ``runs`` (run id -> created ms), all
        ``open``."""
        kept = {run: known for run, known in self.runs.items() if known[0] != job}
        kept.update({run: (job, created) for run, created in runs.items()})
        newest = dict(sorted(kept.items(), key=lambda pair: -pair[1][1])[:RUNS_REMEMBERED])
        states = {run: s for run, s in self.states.items() if run in newest and run not in runs}
        return replace(self, runs=newest, states=states)

    def with_state(self, job: str, run_id: str, state: str, created_ms: int = 0) -> Remembered:
        """This memory with ``run_id`` (of ``job``) in ``state``."""
        runs = dict(self.runs)
        runs[run_id] = (job, created_ms or runs.get(run_id, (job, 0))[1])
        states = {run: s for run, s in self.states.items() if run != run_id}
        if state != OPEN:
            states[run_id] = state
        return replace(self, runs=runs, states=states)

    def after_loss(self, job: str) -> Remembered:
        """This memory with a loss noticed: every job it knows of, and ``job``, in ``unsettled``."""
        jobs = {owner for owner, _ in self.runs.values()} | set(self.fired) | {job}
        return replace(self, unsettled=frozenset(jobs))

    def settled(self, job: str) -> Remembered:
        """This memory with ``job``'s tick after a loss finished (removed from ``unsettled``)."""
        return replace(self, unsettled=self.unsettled - {job})

    def with_fired(self, job: str, fired_ms: int) -> Remembered:
        """This memory with ``job``'s last handled scheduled time ``fired_ms`` (not doubtful)."""
        return replace(self, fired={**self.fired, job: (fired_ms, False)})

    def doubted(self) -> Remembered:
        """This memory with every run ``doubtful``, and every job's last scheduled time."""
        fired = {job: (ms, True) for job, (ms, _) in self.fired.items()}
        return replace(self, states=dict.fromkeys(self.runs, DOUBTFUL), fired=fired)

    def state_of(self, run_id: str) -> str:
        """The state of a remembered run (``open`` unless noted)."""
        return self.states.get(run_id, OPEN)

    def runs_of(self, job: str) -> dict[str, int]:
        """The remembered runs of ``job`` (run id -> created ms)."""
        return {run: created for run, (owner, created) in self.runs.items() if owner == job}

    def to_json(self) -> dict[str, Any]:
        """As JSON-ready data."""
        runs = {run: [job, created] for run, (job, created) in self.runs.items()}
        data: dict[str, Any] = {"id": self.id, "epoch": self.epoch, "seq": self.seq, "runs": runs}
        if self.states:
            data["states"] = dict(self.states)
        if self.fired:
            data["fired"] = {job: [ms, int(doubt)] for job, (ms, doubt) in self.fired.items()}
        if self.unsettled:
            data["unsettled"] = sorted(self.unsettled)
        return data

    @classmethod
    def from_json(cls, data: Any) -> Remembered | None:
        """From :meth:`to_json`'s data; None when it is not such data."""
        try:
            runs = {
                str(run): (str(job), int(created)) for run, (job, created) in data["runs"].items()
            }
            states = {
                str(run): str(state)
                for run, state in dict(data.get("states") or {}).items()
                if state in (CREATING, ENDING, DOUBTFUL) and run in runs
            }
            fired = {
                str(job): (int(ms), bool(doubt))
                for job, (ms, doubt) in dict(data.get("fired") or {}).items()
            }
            unsettled = frozenset(str(job) for job in data.get("unsettled") or [])
            return cls(
                str(data["id"]),
                int(data["epoch"]),
                int(data["seq"]),
                runs,
                states,
                fired,
                unsettled,
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            return None


def recall(store: LeaseStore) -> Remembered | None:
    """What the scheduler remembers of the store's data set: the process's memory, else the
    file's, else RQ's Redis's (when apart); None when none has an entry.

    A process in doubt (:func:`distrust`) reads the shared places first (they may know more
    runs), and treats what it finds as doubtful too: a file is one machine's, and any place
    may be out of date."""
    found = _by_store.get(store)
    if found is None or store in _doubted:
        found = _from_file(store) or _from_queue_redis(store) or found
        if found is not None and store in _doubted:
            found = found.doubted()  # a file is one machine's: it too may be out of date
    return found


def keep(store: LeaseStore, memory: Remembered) -> None:
    """Remembers ``memory`` in every place: the process, the file (when named), RQ's Redis
    (when apart). A place that cannot be written is logged and left out."""
    _by_store[store] = memory
    _doubted.discard(store)
    _to_file(store, memory)
    _to_queue_redis(store, memory)


def note(store: LeaseStore, job: str, run_id: str, state: str, created_ms: int = 0) -> None:
    """Remembers ``run_id`` of ``job`` in ``state``, where the scheduler remembers anything
    (a scheduler that remembers nothing has no mark to tell a loss by)."""
    memory = recall(store)
    if memory is not None:
        keep(store, memory.with_state(job, run_id, state, created_ms))


def keep_in_doubt(store: LeaseStore, memory: Remembered) -> None:
    """Remembers ``memory`` in this process only, in doubt (a copy of the server's state that
    a worker keeps while another leads: :func:`redis_lease.fleet.loss.data_set_mark.mirror`)."""
    _by_store[store] = memory
    _doubted.add(store)


def distrust(store: LeaseStore) -> None:
    """Marks every run this process remembers doubtful: another scheduler may have ticked
    since it wrote its memory (a tick leader whose leadership had a break)."""
    memory = _by_store.get(store)
    if memory is not None:
        _by_store[store] = memory.doubted()
        _doubted.add(store)


def _entry(store: LeaseStore) -> str:
    return f"{safe_url(store.url)}|{store.prefix}"


def _mark_file() -> Path | None:
    named = os.environ.get(MARK_FILE_ENV, "")
    return Path(named) if named else None


def _read_file(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        log.warning("cannot read %s (%s): %s", path, MARK_FILE_ENV, error)
        return {}
    return data if isinstance(data, dict) else {}


def _from_file(store: LeaseStore) -> Remembered | None:
    path = _mark_file()
    return None if path is None else Remembered.from_json(_read_file(path).get(_entry(store)))


def _to_file(store: LeaseStore, memory: Remembered) -> None:
    path = _mark_file()
    if path is None:
        return
    data = {**_read_file(path), _entry(store): memory.to_json()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(handle, "w") as out:
                json.dump(data, out)
            os.replace(temporary, path)  # whole or not at all
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
    except OSError as error:
        log.warning("cannot write %s (%s): %s", path, MARK_FILE_ENV, error)


def _queue_redis(store: LeaseStore) -> redis.Redis | None:
    """RQ's Redis when it is not the lease store's, else None."""
    try:
        client = store.rq
    except InvalidInput:  # a cluster without a queue URL: no Redis apart
        return None
    return None if client is store.client else client


def _queue_key(store: LeaseStore) -> str:
    return store.keys.data_set_remembered


def _from_queue_redis(store: LeaseStore) -> Remembered | None:
    client = _queue_redis(store)
    if client is None:
        return None
    try:
        raw = client.get(_queue_key(store))
        return Remembered.from_json(json.loads(as_text(raw))) if raw else None
    except (redis.RedisError, ValueError) as error:
        log.warning("cannot read the remembered data set from RQ's Redis: %s", error)
        return None


def _to_queue_redis(store: LeaseStore, memory: Remembered) -> None:
    client = _queue_redis(store)
    if client is None:
        return
    try:
        client.set(_queue_key(store), json.dumps(memory.to_json()))
    except redis.RedisError as error:
        log.warning("cannot remember the data set in RQ's Redis: %s", error)


__all__ = [
    "CREATING",
    "DOUBTFUL",
    "ENDING",
    "MARK_FILE_ENV",
    "MAY_BE_OPEN",
    "OPEN",
    "RUNS_REMEMBERED",
    "Remembered",
    "distrust",
    "keep",
    "keep_in_doubt",
    "note",
    "recall",
]
