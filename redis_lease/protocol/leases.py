"""Small immutable values the store takes and returns: leases, their replies, requests.

The values of one concept each live in their own module and are named here too: an item as
stored (:mod:`.records`), the attempt log's entries (:mod:`.attempts`), a run's accounting
(:mod:`.accounting`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from .accounting import COUNT_STATES, RunStatus
from .attempts import ATTEMPT_EVENTS, Attempt
from .guards import Condition, Write
from .records import (
    RECORD_FIELDS,
    TEXT_SUFFIXES,
    ItemError,
    ItemRecord,
    effect_record,
    from_ms,
    parse_errors,
    parse_record,
    read_items,
)

__all__ = [
    "ATTEMPT_EVENTS",
    "COUNT_STATES",
    "RECORD_FIELDS",
    "TEXT_SUFFIXES",
    "Attempt",
    "CommitReply",
    "CommitRequest",
    "FailReply",
    "FailRequest",
    "Item",
    "ItemError",
    "ItemRecord",
    "Lease",
    "ReleaseRequest",
    "RunStatus",
    "SettleRequest",
    "effect_record",
    "from_ms",
    "parse_errors",
    "parse_record",
    "read_items",
]


@dataclass(frozen=True)
class Lease:
    """The right to work on one item until ``expires_at_ms``, proven by ``token``.

    A lease built by :meth:`from_token` (from a token given on a command line) has no
    expiry, payload or trace id; the server checks the token either way. ``trace_id``
    names the attempt in the shard's attempt log (see :mod:`redis_lease.protocol.tracing`).
    """

    run_id: str
    item_id: str
    shard: int
    token: int
    lease_id: str
    expires_at_ms: int = 0
    attempt: int = 0
    payload: Any = None
    takeover: bool = False
    worker: str = ""
    trace_id: str = ""

    @classmethod
    def from_token(
        cls, run_id: str, item_id: str, shard: int, token: int, lease_id: str = ""
    ) -> Lease:
        """A lease known only by its run, item, shard, token and lease id (when known):
        no expiry, attempt, payload or trace id. Enough to renew, commit, fail or
        release it; the server checks the token (and the lease id, when given)."""
        return cls(run_id, item_id, shard, token, lease_id)

    @property
    def expires_at(self) -> datetime:
        """The lease expiry on the server clock."""
        return from_ms(self.expires_at_ms)

    def to_dict(self) -> dict[str, Any]:
        """The lease as JSON-ready data (``expires_at`` in ISO 8601 UTC)."""
        return {
            "run": self.run_id,
            "item": self.item_id,
            "shard": self.shard,
            "token": self.token,
            "lease_id": self.lease_id,
            "expires_at": self.expires_at.isoformat(timespec="milliseconds"),
            "attempt": self.attempt,
            "payload": self.payload,
            "takeover": self.takeover,
            "trace_id": self.trace_id,
        }


@dataclass(frozen=True)
class CommitReply:
    """What a commit stored; ``repeated`` when an earlier identical commit stored it.

    The one type of a commit's reply, from ``commit`` and ``settle`` alike (the script's
    reply is decoded into it in :mod:`redis_lease.protocol.replies`)."""

    token: int
    result: Any
    done_at_ms: int
    repeated: bool


@dataclass(frozen=True)
class FailReply:
    """Where a failed item went: ``retry`` (due again at ``eligible_at_ms``) or ``dead``,
    and when, on the server clock (``now_ms``).

    The one type of a failure's reply, from ``fail`` and ``settle`` alike."""

    state: str
    eligible_at_ms: int
    attempts: int
    now_ms: int = 0


@dataclass(frozen=True)
class Item:
    """An item to add: a stable id and a small JSON payload."""

    id: str
    payload: Any = None


@dataclass(frozen=True)
class CommitRequest:
    """One commit of :meth:`~redis_lease.LeaseStore.commit_many`."""

    lease: Lease
    result: Any = None
    conditions: tuple[Condition, ...] = ()
    writes: tuple[Write, ...] = ()
    #: The commit's label, counted as ``outcome_<label>`` (what the metrics call its outcome).
    label: str = ""


@dataclass(frozen=True)
class FailRequest:
    """One failed attempt of :meth:`~redis_lease.LeaseStore.settle_many`."""

    lease: Lease
    error: str
    permanent: bool = False


@dataclass(frozen=True)
class ReleaseRequest:
    """One release of :meth:`~redis_lease.LeaseStore.settle_many` (``delay`` seconds)."""

    lease: Lease
    delay: float = 0.0


#: What :meth:`~redis_lease.LeaseStore.settle_many` takes.
SettleRequest = CommitRequest | FailRequest | ReleaseRequest
