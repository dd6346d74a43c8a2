"""Small immutable values returned by the store."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..deprecation import renamed_attribute, warn_renamed
from .guards import Condition, Write

#: Old class names, importable with a DeprecationWarning for one release.
_RENAMED = {"CommitOutcome": "CommitReply", "FailOutcome": "FailReply"}


def __getattr__(name: str) -> Any:
    """The classes under their old names (``CommitOutcome``, ``FailOutcome``), with a
    DeprecationWarning."""
    return renamed_attribute(__name__, name, _RENAMED, globals())


def from_ms(ms: int) -> datetime:
    """A server time in milliseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


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

    @classmethod
    def ref(cls, run_id: str, item_id: str, shard: int, token: int, lease_id: str = "") -> Lease:
        """Deprecated: :meth:`from_token`."""
        warn_renamed("Lease.ref()", "Lease.from_token()")
        return cls.from_token(run_id, item_id, shard, token, lease_id)

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
class ItemError:
    """One of an item's last errors: its text, and the attempt, time and trace id it came
    from (0, None and '' for an error an earlier version stored)."""

    error: str
    attempt: int = 0
    at: datetime | None = None
    trace_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The error as JSON-ready data (``at`` in ISO 8601 UTC, or None)."""
        return {
            "error": self.error,
            "attempt": self.attempt,
            "at": self.at.isoformat(timespec="milliseconds") if self.at else None,
            "trace_id": self.trace_id,
        }


def parse_errors(text: str | bytes | None) -> tuple[ItemError, ...]:
    """The errors kept in ``<item id>#e``, oldest first: a JSON array of
    ``{"error", "attempt", "at", "trace"}`` objects, or an earlier version's one text."""
    if text is None:
        return ()
    raw = _text(text)
    if raw.startswith("[{"):
        try:
            entries = json.loads(raw)
        except ValueError:
            entries = None
        if isinstance(entries, list) and all(
            isinstance(e, dict) and isinstance(e.get("error"), str) for e in entries
        ):
            return tuple(
                ItemError(
                    error=e["error"],
                    attempt=int(e.get("attempt") or 0),
                    at=from_ms(int(e["at"])) if e.get("at") else None,
                    trace_id=str(e.get("trace") or ""),
                )
                for e in entries
            )
    return (ItemError(raw),)


@dataclass(frozen=True)
class ItemRecord:
    """An item as stored, for inspection: ``error`` is its last error, ``errors`` its last
    few (limits.ERROR_HISTORY), oldest first."""

    run_id: str
    item_id: str
    shard: int
    state: str
    token: int
    attempts: int
    payload: Any
    lease_id: str | None = None
    owner: str | None = None
    expires_at_ms: int | None = None
    result: Any = None
    error: str | None = None
    errors: tuple[ItemError, ...] = ()

    @classmethod
    def from_record(
        cls,
        run_id: str,
        item_id: str,
        shard: int,
        raw: bytes | str,
        result: bytes | str | None = None,
        error: bytes | str | None = None,
    ) -> ItemRecord:
        """Decodes a stored record (which holds the payload) and its texts (result, errors)."""
        rec = parse_record(raw)
        payload = rec.get("payload")
        result = rec.get("result", result)
        errors = parse_errors(rec.get("error", error))
        return cls(
            run_id=run_id,
            item_id=item_id,
            shard=shard,
            state=rec["state"],
            token=int(rec.get("token") or 0),
            attempts=int(rec.get("attempts") or 0),
            payload=_loads(payload),
            lease_id=rec.get("lease_id"),
            owner=rec.get("owner"),
            expires_at_ms=int(rec["expires_at"]) if rec.get("expires_at") else None,
            result=_loads(result),
            error=errors[-1].error if errors else None,
            errors=errors,
        )


#: The fields of a packed item record, in order (see lua/include/record.lua).
RECORD_FIELDS = (
    "state", "token", "attempts", "lease_id", "owner", "leased_at", "expires_at", "done_at",
    "outcome", "late", "eligible_at", "payload",
)  # fmt: skip
#: The fields of the packed records of earlier versions (no eligible_at).
RECORD_FIELDS_11 = tuple(name for name in RECORD_FIELDS if name != "eligible_at")
_NUMBERS = frozenset(("token", "attempts", "leased_at", "expires_at", "done_at", "eligible_at"))
#: The suffixes of an item's texts beside its record in the items hash: result, error.
TEXT_SUFFIXES = {"result": "#r", "error": "#e"}


def parse_record(raw: bytes | str) -> dict[str, Any]:
    """An item record as a dict: the packed form, or an earlier version's JSON object
    (which holds its payload, result and error itself). Absent fields are left out.

    Raises:
        ValueError: the text is neither form.
    """
    text = _text(raw)
    if text.startswith("{"):
        rec: dict[str, Any] = json.loads(text)
        if not isinstance(rec, dict) or not isinstance(rec.get("state"), str):
            raise ValueError(f"not an item record: {text[:80]!r}")
        return rec
    parts = text.split("|", len(RECORD_FIELDS) - 1)
    names: tuple[str, ...] = RECORD_FIELDS
    # An 11-field record's payload is JSON text, which never begins with digits and a '|'.
    if len(parts) != len(RECORD_FIELDS) or (parts[10] != "" and not parts[10].isdigit()):
        names = RECORD_FIELDS_11
        parts = text.split("|", len(names) - 1)
    if len(parts) != len(names) or not parts[0].isalpha():
        raise ValueError(f"not an item record: {text[:80]!r}")
    packed: dict[str, Any] = {}
    for name, value in zip(names, parts, strict=True):
        if value == "":
            continue
        packed[name] = int(value) if name in _NUMBERS else value
    if "late" in packed:
        packed["late"] = packed["late"] == "1"
    return packed


def read_items(fields: Mapping[Any, Any]) -> dict[str, dict[str, Any]]:
    """The records of an items hash (all of its fields, as HGETALL gives them), each a
    :func:`parse_record` dict with its ``result`` text, its last ``error`` text and its
    ``errors`` (:func:`parse_errors`)."""
    texts = {_text(k): _text(v) for k, v in fields.items()}
    records: dict[str, dict[str, Any]] = {}
    for field_name, raw in texts.items():
        if "#" in field_name:
            continue
        rec = parse_record(raw)
        for name, suffix in TEXT_SUFFIXES.items():
            if name not in rec and field_name + suffix in texts:
                rec[name] = texts[field_name + suffix]
        if "error" in rec:
            rec["errors"] = parse_errors(rec["error"])
            rec["error"] = rec["errors"][-1].error
        records[field_name] = rec
    return records


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _loads(text: str | bytes | None) -> Any:
    return json.loads(text) if text else None


#: What ended an attempt, as the attempt log names it (see lua/include/attempt_log.lua).
ATTEMPT_EVENTS = ("committed", "retry", "dead", "released", "refused", "takeover", "expired")


@dataclass(frozen=True)
class Attempt:
    """One entry of a shard's attempt log: how one attempt on an item ended.

    ``event`` is one of :data:`ATTEMPT_EVENTS`. For ``refused`` (a holder call refused
    with LEASE_LOST) ``token`` is the token the caller sent, ``error`` the refusal's
    detail, and ``attempt``, ``worker`` and the durations are unknown (0, '' and None).
    ``queue_age_seconds`` is the wait from eligible to claimed, ``duration_seconds`` from
    claimed to the entry (None when unknown).
    """

    at: datetime
    item_id: str
    attempt: int
    token: int
    event: str
    queue_age_seconds: float | None
    duration_seconds: float | None
    worker: str
    error: str | None
    trace_id: str
    label: str = ""
    entry_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The attempt as JSON-ready data (``at`` in ISO 8601 UTC)."""
        return {
            "at": self.at.isoformat(timespec="milliseconds"),
            "item": self.item_id,
            "attempt": self.attempt,
            "token": self.token,
            "event": self.event,
            "queue_age_seconds": self.queue_age_seconds,
            "duration_seconds": self.duration_seconds,
            "worker": self.worker,
            "error": self.error,
            "trace_id": self.trace_id,
            "label": self.label,
            "entry_id": self.entry_id,
        }

    @classmethod
    def from_entry(cls, entry_id: bytes | str, fields: Mapping[Any, Any]) -> Attempt:
        """Decodes one stream entry (its id, whose first part is the time in ms, and fields)."""
        entry = _text(entry_id)
        values = {_text(k): _text(v) for k, v in fields.items()}

        def seconds(name: str) -> float | None:
            value = values.get(name, "")
            return int(value) / 1000 if value.isdigit() else None

        return cls(
            at=from_ms(int(entry.split("-", 1)[0])),
            item_id=values.get("item", ""),
            attempt=int(values.get("attempt") or 0),
            token=int(values.get("token") or 0),
            event=values.get("event", ""),
            queue_age_seconds=seconds("queue_ms"),
            duration_seconds=seconds("run_ms"),
            worker=values.get("worker", ""),
            error=values.get("error") or None,
            trace_id=values.get("trace", ""),
            label=values.get("label", ""),
            entry_id=entry,
        )


#: The states an item is counted in; a run's items are the sum over them.
COUNT_STATES = ("pending", "leased", "done", "dead")


@dataclass(frozen=True)
class RunStatus:
    """Counts and ages of a run, summed over its shards.

    The one definition of a run's accounting: :attr:`planned`, :attr:`unfinished`,
    :attr:`finished`, :attr:`lost` and :attr:`late`. Status, the tick (dispatch,
    burst, projected finish) and finalizing use only these.
    """

    run_id: str
    shards: int
    state: str
    counts: dict[str, int]
    #: The shards' counters summed (claims, commits, takeovers, ``outcome_<label>``, ...).
    counters: dict[str, int]
    oldest_eligible_age_seconds: float
    oldest_leased_age_seconds: float
    now_ms: int
    oldest_unknown_effect_age_seconds: float = 0.0
    info: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def unfinished_of(counts: Mapping[str, int]) -> int:
        """Items still to work in ``counts`` (a run's or one shard's): pending or leased."""
        return counts.get("pending", 0) + counts.get("leased", 0)

    @property
    def total(self) -> int:
        """The run's items now, in every state."""
        return sum(self.counts.values())

    @property
    def planned(self) -> int:
        """Items planned: the count recorded when planning ended, or the shards' ``added``
        counters when more were added since (or the run was never planned)."""
        recorded = int(self.info.get("planned_items") or 0)
        return max(recorded, self.counters.get("added", 0))

    @property
    def unfinished(self) -> int:
        """Items still to work: pending or leased."""
        return self.unfinished_of(self.counts)

    @property
    def finished(self) -> int:
        """Items no longer worked: done, or dead after their last attempt."""
        return self.counts["done"] + self.counts["dead"]

    @property
    def lost(self) -> int:
        """Items planned but in no state any more: their record or index entry vanished."""
        return max(0, self.planned - self.total)

    @property
    def late(self) -> int:
        """Commits accepted after the deadline (their lease was granted before it)."""
        return self.counters.get("late_commits", 0)

    @property
    def events(self) -> dict[str, int]:
        """Deprecated: :attr:`counters`."""
        warn_renamed("RunStatus.events", "RunStatus.counters")
        return self.counters

    @property
    def complete(self) -> bool:
        """Exactly the planned items, every one done before the deadline (none lost or late)."""
        return self.counts["done"] == self.planned == self.total and self.late == 0

    def to_dict(self) -> dict[str, Any]:
        """The status as JSON-ready data."""
        return {
            "run": self.run_id,
            "state": self.state,
            "shards": self.shards,
            "counts": dict(self.counts),
            "total": self.total,
            "planned": self.planned,
            "unfinished": self.unfinished,
            "finished": self.finished,
            "lost": self.lost,
            "late": self.late,
            "events": dict(self.counters),  # the JSON key stays
            "oldest_eligible_age_seconds": self.oldest_eligible_age_seconds,
            "oldest_leased_age_seconds": self.oldest_leased_age_seconds,
            "oldest_unknown_effect_age_seconds": self.oldest_unknown_effect_age_seconds,
            **({"info": dict(self.info)} if self.info else {}),
        }


@dataclass(frozen=True)
class CommitRequest:
    """One commit of :meth:`~redis_lease.store.LeaseStore.commit_many`."""

    lease: Lease
    result: Any = None
    conditions: tuple[Condition, ...] = ()
    writes: tuple[Write, ...] = ()
    #: The commit's label, counted as ``outcome_<label>`` (what the metrics call its outcome).
    label: str = ""
    #: Deprecated: ``label``.
    outcome: InitVar[str | None] = None

    def __post_init__(self, outcome: str | None) -> None:
        if outcome is not None:
            warn_renamed("CommitRequest(outcome=...)", "CommitRequest(label=...)", stacklevel=4)
            object.__setattr__(self, "label", outcome)


@dataclass(frozen=True)
class FailRequest:
    """One failed attempt of :meth:`~redis_lease.store.LeaseStore.settle_many`."""

    lease: Lease
    error: str
    permanent: bool = False


@dataclass(frozen=True)
class ReleaseRequest:
    """One release of :meth:`~redis_lease.store.LeaseStore.settle_many` (``delay`` seconds)."""

    lease: Lease
    delay: float = 0.0


#: What :meth:`~redis_lease.store.LeaseStore.settle_many` takes.
SettleRequest = CommitRequest | FailRequest | ReleaseRequest


def effect_record(raw: str | bytes) -> dict[str, Any]:
    """An effect record with its result (stored as JSON text) decoded."""
    record: dict[str, Any] = json.loads(raw)
    if isinstance(record.get("result"), str):
        record["result"] = json.loads(record["result"])
    return record
