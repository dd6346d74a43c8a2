"""What the checker reads about one run, and how it is gathered from Redis and the histories.

:class:`Evidence` holds the recorded operations, the planned items, each item's
final :class:`Record`, the run's state and deadline, the commit marks and the
provider's count of applications per idempotency key; :func:`collect` reads all
of it after a run. :mod:`tests.faults.checker` judges it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from redis_lease import LeaseStore
from redis_lease.errors import NotFound
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.protocol.connection.clients import as_text
from redis_lease.protocol.leases import read_items
from tests.faults.recorder import Op, read_lines, read_ops


@dataclass(frozen=True)
class Record:
    """An item's final record: state, token and (when done) the server time of its commit."""

    state: str
    token: int
    done_at_ms: int | None = None


@dataclass
class Evidence:
    """Everything the checker reads about one run."""

    run_id: str
    planned: list[str]
    ops: list[Op]
    #: Final record per item id (an item without a record has vanished).
    records: dict[str, Record]
    #: The run's final state ('' when the run's record is gone; None: not checked)
    #: and deadline (ms, 0: none).
    run_state: str | None
    deadline_ms: int
    #: Tokens of the ``<item>|<token>`` marks commits left, per item (None: a job
    #: without marks).
    marks: dict[str, set[int]] | None = field(default_factory=dict)
    #: Times the provider applied each idempotency key.
    applied: Mapping[str, int] = field(default_factory=dict)
    #: Effect names every done item applies (their keys: ``idempotency_key``).
    effects: tuple[str, ...] = ()
    #: The store's key prefix: operations under another prefix are another run's.
    prefix: str | None = None


def marks_key(prefix: str, run_id: str, shard: int) -> str:
    """The set of ``<item>|<token>`` marks of a shard (it carries the shard's hash tag)."""
    return f"{prefix}:{{{run_id}#{shard}}}:marks"


def collect(
    store: LeaseStore,
    run_id: str,
    planned: Sequence[str],
    *,
    history_dir: Path | None = None,
    ops: list[Op] | None = None,
    applied: Mapping[str, int],
    effects: tuple[str, ...] = (),
    shards: int | None = None,
    marked: bool = True,
) -> Evidence:
    """Reads the history files, the final records, the run and the marks of ``run_id``.

    The operations are ``ops`` when given, else every history file in ``history_dir``.
    ``shards`` is needed only when the run's record is gone (a restart without data);
    ``marked=False`` for a job whose commits leave no marks.
    """
    if ops is None:
        if history_dir is None:
            raise ValueError("collect needs the operations or the directory of their history")
        ops = read_ops(list(read_lines(history_dir)))
    runs = Runs(store)
    try:
        info = runs.info(run_id)
    except NotFound:
        info = {}
    count = int(info.get("shards", 0)) or shards or 0
    records: dict[str, Record] = {}
    marks: dict[str, set[int]] = defaultdict(set)
    client = store.client
    for shard in range(count):
        fields = dict(client.hscan_iter(store.keys.shard(run_id, shard)[2], count=500))
        for item, rec in read_items(fields).items():
            done_at = rec.get("done_at")
            records[item] = Record(
                rec["state"], int(rec.get("token", 0)), int(done_at) if done_at else None
            )
        for member in client.smembers(marks_key(store.prefix, run_id, shard)):
            item, _, token = as_text(member).rpartition("|")
            marks[item].add(int(token))
    return Evidence(
        run_id=run_id,
        planned=list(planned),
        ops=ops,
        records=records,
        run_state=info.get("state", ""),
        deadline_ms=int(info.get("deadline_at", "0") or 0),
        marks=dict(marks) if marked else None,
        applied=dict(applied),
        effects=effects,
        prefix=store.prefix,
    )
