"""Effects under the fence: idempotency keys, the effect ledger, reconciliation.

An external effect (a payment correction, an email) is recorded per item by its
idempotency key, written only under the current lease::

    intended (before the call) -> applied (with the provider's reference)
                               -> failed  (nothing applied: refused, or never sent)
                               -> unknown (timeout, reset, 5xx after sending)

What a call's exception means (:func:`apply_effect`):

- ``EffectFailed`` (``Throttled``), ``SlotTimeout``, or an error that shows no
  connection was made (:func:`not_sent`): nothing was applied; the ledger says
  ``failed`` and the attempt is retried (with backoff; a throttle releases the
  item instead), and the next attempt sends again.
- anything else: the provider may have applied it; the ledger says ``unknown``.
  With ``lookup`` the next attempt asks the provider first, with
  ``honours_keys`` it sends the same key again; with neither the item goes dead
  at once with ``NeedsReconciliation``, whose message says how to resolve it.

The original exception is always kept: raised as is, or chained (``raise ...
from error``) with its type and message in the stored error text.

In a run made again after a loss of data, or one that lived through it (its shards
marked by :meth:`~redis_lease.LeaseStore.set_after_loss`), the ledger may have gone
with the loss: an effect with no record is recorded ``unknown`` by the same script that
reads the ledger, and reconciled like any other doubt before anything is sent.

The intent is recorded right before the call in the script that checks the lease and,
given ``ttl``, renews it: the item can be taken over only while the call itself is under
way. What holds, per provider (docs/concepts/effects-and-idempotency.md, "What each
provider is promised"):

- ``honours_keys=True`` (the provider dedupes by key): applied at most once, always.
- ``lookup`` only (no dedupe): at most once, except a call still on its way when its
  item is taken over (its worker paused, cut off from Redis or killed mid-call past its
  lease or heartbeat, or its lease lost with the data): the new holder's lookup cannot
  see it, sends again, and the late call is applied a second time.
- neither: at most once; any doubt stops the item with ``NeedsReconciliation``.

The key is ``<run id>|<item id>|<effect>`` (the run id is ``<job>:<date>``),
never from the token or attempt, so a stale worker and the new owner send the
same key to the provider. Ids cannot contain ``|``, so no two (run, item,
effect) triples share a key. Ledgers written before this encoding keep their
keys (``<run>:<item>:<effect>``): :func:`apply_effect` goes on using an old
key that holds the same item's effect.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

from ...errors import (
    EffectFailed,
    EffectUnknown,
    InvalidInput,
    NeedsReconciliation,
    NotClaimable,
    NotFound,
    RedisLeaseError,
    RunClosed,
    SlotTimeout,
    Throttled,
)
from ...limits import TEXT_MAX_BYTES, bound
from ...protocol.connection.clients import queue_time, time_ms
from ...protocol.store.lease_store import LeaseStore
from ...protocol.validation import check_id, clip

if TYPE_CHECKING:
    from ...protocol.leases import Lease

__all__ = [
    "KEY_MAX_LENGTH",
    "SEPARATOR",
    "EffectFailed",
    "EffectUnknown",
    "NeedsReconciliation",
    "Throttled",
    "apply_effect",
    "check_resolve",
    "idempotency_key",
    "not_sent",
    "resolve_effect",
]

#: The protocol's longest key; providers commonly accept keys of up to 255 characters.
KEY_MAX_LENGTH = bound("key_length")[1]
#: Joins run, item and effect: a character no id may contain.
SEPARATOR = "|"
_DIGEST_LENGTH = 64  # SHA-256 in hex

#: OS errors raised before a connection exists: nothing can have reached the provider.
NOT_CONNECTED: tuple[type[BaseException], ...] = (ConnectionRefusedError, socket.gaierror)
#: Connect-phase errors of common HTTP clients, by class name (httpx and httpcore,
#: requests, urllib3, aiohttp): raised before a byte of the request is written.
CONNECT_ERRORS = frozenset(
    {
        "ConnectError",
        "ConnectTimeout",
        "NewConnectionError",
        "ConnectTimeoutError",
        "NameResolutionError",
        "ClientConnectorError",
    }
)
_CHAIN_MAX = 16  # wrappers followed at most
_ERROR_TEXT_MAX = TEXT_MAX_BYTES  # bytes of an error text kept; escaped, well within the JSON bound


def idempotency_key(run_id: str, item_id: str, effect: str) -> str:
    """The effect's key: ``<run id>|<item id>|<effect>``, e.g. ``nightly:2026-12-02|acct_7|pay``.

    Stable across retries, tokens and workers, and different for any other
    (run, item, effect). A key longer than KEY_MAX_LENGTH keeps its head and
    ends with ``~`` and a SHA-256 digest of the whole (short keys have no ``~``).

    Raises:
        InvalidInput: an id or the effect name is not a valid id.
    """
    check_id(run_id, "run id")
    check_id(item_id, "item id")
    check_id(effect, "effect name")
    return _bounded(SEPARATOR.join((run_id, item_id, effect)))


def _bounded(key: str) -> str:
    if len(key) <= KEY_MAX_LENGTH:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{key[: KEY_MAX_LENGTH - _DIGEST_LENGTH - 1]}~{digest}"


def _wrapped(error: BaseException) -> Iterator[BaseException]:
    """The error and those it wraps: ``raise ... from``, a ``reason`` (urllib3's
    MaxRetryError) or a first argument that is an exception (requests' errors)."""
    current: BaseException | None = error
    seen: set[int] = set()
    while current is not None and id(current) not in seen and len(seen) < _CHAIN_MAX:
        seen.add(id(current))
        yield current
        reason = getattr(current, "reason", None)
        first = current.args[0] if current.args else None
        current = next(
            (e for e in (current.__cause__, reason, first) if isinstance(e, BaseException)), None
        )


def not_sent(error: BaseException) -> bool:
    """True when ``error`` shows that the call never reached the provider.

    That is a refused connection or a failed name lookup (``ConnectionRefusedError``,
    ``socket.gaierror``), or an HTTP client's connect-phase error (a class named in
    CONNECT_ERRORS), raised or wrapped. A timeout or reset is not: a request may have
    left before it. A call that knows more raises ``EffectFailed`` itself.
    """
    return any(
        isinstance(cause, NOT_CONNECTED) or type(cause).__name__ in CONNECT_ERRORS
        for cause in _wrapped(error)
    )


def _text(error: BaseException) -> str:
    """``Type: message``, as the ledger and the item's last error keep it (clipped: a
    huge message must not make the ledger refuse the record)."""
    return clip(f"{type(error).__name__}: {error}", _ERROR_TEXT_MAX)


def _stored_error(record: dict[str, Any]) -> str:
    """A ledger record's error text (kept as JSON text, like its result)."""
    raw = record.get("error")
    try:
        error = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        error = raw
    return str(error)


def _how_to_reconcile(run_id: str, item_id: str, name: str) -> str:
    return (
        "check the key at the provider, then either give lease.effect a lookup= "
        "(or honours_keys=True when the provider dedupes by key) and run "
        f"'redis-lease requeue {run_id} {item_id}', or record its answer with "
        f"'redis-lease resolve-effect {run_id} {item_id} {name} --applied RESULT' (or "
        "--not-applied), or "
        f"redis_lease.resolve_effect(store, {run_id!r}, {item_id!r}, {name!r}, "
        "applied=...)"
    )


def _doubt(lease: Lease, key: str, name: str, previous: str, record: dict[str, Any]) -> str:
    """Why an open record (``previous``: intended or unknown) may have been applied, and
    how to resolve it: the text of its NeedsReconciliation."""
    if record.get("after_loss"):
        why = (
            f"it has no ledger record, but run {lease.run_id!r} was made again after a loss "
            "of data (or lived through one) and its ledger may have gone with it"
        )
    elif previous == "unknown":
        why = f"an earlier attempt (token {record.get('token')}) ended: {_stored_error(record)}"
    else:
        why = (
            f"an earlier attempt (token {record.get('token')}) recorded its intent and never "
            "its outcome (its worker stopped or lost the lease)"
        )
    return (
        f"needs reconciliation: effect {key!r} may have been applied: {why}; "
        + _how_to_reconcile(lease.run_id, lease.item_id, name)
    )


def apply_effect(
    store: LeaseStore,
    lease: Lease,
    name: str,
    call: Callable[[str], Any],
    *,
    lookup: Callable[[str], Any] | None = None,
    honours_keys: bool = False,
    before_call: Callable[[], None] | None = None,
    ttl: float | None = None,
) -> Any:
    """Applies an effect under the fence, reconciling any doubt before it sends.

    The intent is recorded in the script that checks the lease, right before ``call``;
    with ``ttl`` that script also renews the lease, so the item can be taken over only
    while the call is under way. A doubt is an earlier attempt left open (``intended``
    or ``unknown``) or, in a run made again after a loss of data, no record at all.
    What holds, by what the handler declares (the table in
    docs/concepts/effects-and-idempotency.md):

    - ``honours_keys=True``, a provider that dedupes by key: applied at most once,
      always; a doubt sends the same key again.
    - ``lookup`` only, a provider that does not dedupe: a doubt is looked up first.
      At most once, except a call still on its way when its item is taken over (its
      worker paused, cut off or killed mid-call past its lease or heartbeat, or its
      lease lost with the data): the new holder's lookup cannot see it, and the late
      call is applied a second time.
    - neither: at most once; a doubt raises NeedsReconciliation (the item goes dead).

    Args:
        call: sends the effect with the key; returns the provider's result (JSON).
            It raises EffectFailed (or Throttled) when the provider did nothing;
            an error that shows no connection was made (:func:`not_sent`) counts
            the same; anything else (EffectUnknown, a timeout) is ambiguous.
        lookup: asks the provider for the key's outcome: the result when it was
            applied, None when it was not; raises EffectUnknown when it cannot tell.
        honours_keys: the provider dedupes by key, so a retry with the same key is safe.
        before_call: runs just before ``call`` (after the intent is recorded); raising
            EffectFailed there means the call is not sent (a lease that ran out meanwhile).
        ttl: renews the lease for this many seconds when the intent is recorded, right
            before ``call`` (None: not renewed).

    Returns:
        The provider's result, the stored one when the effect was applied before.

    Raises:
        LeaseLost: the lease is no longer held (nothing is sent then).
        EffectFailed: nothing was applied (the call's own, or one chained to the
            call's connect error); the attempt is retried.
        EffectUnknown: the outcome is ambiguous and the next attempt reconciles it
            (the call's own, or one chained to the call's error).
        NeedsReconciliation: the outcome is ambiguous, now, from an earlier attempt
            or after a loss of data, and neither ``lookup`` nor ``honours_keys`` can
            resolve it; :func:`resolve_effect` (``redis-lease resolve-effect``) can.
    """
    key = idempotency_key(lease.run_id, lease.item_id, name)
    # One round trip records the intent, or returns the open record untouched.
    previous, record, key = store.begin_effect(lease, key, name, ttl=ttl)
    if previous == "applied":
        return record.get("result")
    if previous in ("intended", "unknown"):
        # An earlier attempt, or the first run before a loss of data, may have reached
        # the provider: reconcile before re-issuing.
        if lookup is not None:
            found = lookup(key)
            if found is not None:
                _, stored = store.record_effect(lease, key, name, "applied", found)
                return stored.get("result")
        elif not honours_keys:
            raise NeedsReconciliation(
                _doubt(lease, key, name, previous, record),
                run_id=lease.run_id,
                item_id=lease.item_id,
                token=lease.token,
            )
        store.record_effect(lease, key, name, "intended", None, ttl=ttl)
    try:
        if before_call is not None:
            before_call()
        result = call(key)
    except BaseException as error:
        _settle_error(store, lease, key, name, error, lookup is not None or honours_keys)
    _, stored = store.record_effect(lease, key, name, "applied", result)
    return stored.get("result")


def _settle_error(
    store: LeaseStore, lease: Lease, key: str, name: str, error: BaseException, reconcilable: bool
) -> NoReturn:
    """Records what the call's error means in the ledger, then raises what the worker sees."""
    context: dict[str, Any] = {
        "run_id": lease.run_id,
        "item_id": lease.item_id,
        "token": lease.token,
    }
    if isinstance(error, EffectFailed | SlotTimeout):  # the provider did nothing, or no slot
        store.record_effect(lease, key, name, "failed", _text(error))
        raise error
    if not isinstance(error, RedisLeaseError) and isinstance(error, Exception) and not_sent(error):
        store.record_effect(lease, key, name, "failed", f"not sent: {_text(error)}")
        raise EffectFailed(
            f"effect {key!r} was not sent: {_text(error)}; the attempt is retried", **context
        ) from error
    store.record_effect(lease, key, name, "unknown", _text(error))
    if not isinstance(error, Exception) or (
        isinstance(error, RedisLeaseError) and not isinstance(error, EffectUnknown)
    ):
        raise error  # a stop (KeyboardInterrupt, a lost lease): not the provider's answer
    if not reconcilable:
        raise NeedsReconciliation(
            f"needs reconciliation: effect {key!r} may have been applied ({_text(error)}); "
            + _how_to_reconcile(lease.run_id, lease.item_id, name),
            **context,
        ) from error
    if isinstance(error, EffectUnknown):
        raise error
    raise EffectUnknown(
        f"effect {key!r} may have been applied: {_text(error)}; the next attempt "
        "reconciles it before sending again",
        **context,
    ) from error


def check_resolve(run_id: str, item_id: str, name: str, worker: str) -> None:
    """What :func:`resolve_effect` checks before it reads: the run, item and effect names
    and the worker who resolves it."""
    check_id(run_id, "run id")
    check_id(item_id, "item id")
    check_id(name, "effect name")
    check_id(worker, "worker")


def resolve_effect(
    store: LeaseStore,
    run_id: str,
    item_id: str,
    name: str,
    *,
    applied: bool,
    result: Any = None,
    worker: str = "operator",
) -> dict[str, Any]:
    """Records the provider's answer for an effect whose outcome is unknown.

    For an operator who asked the provider by key (see the item's
    NeedsReconciliation message: an earlier attempt left open, or a run made again
    after a loss of data) when the handler has no ``lookup``:
    ``applied=True`` stores ``result`` as the effect's result (it is never sent
    again; the next attempt returns it), ``applied=False`` records that nothing
    was applied (the next attempt sends it again). The item is requeued when it
    is dead and claimed under a lease of its own, so the write is fenced like a
    worker's; then it is released, due at once.

    Returns:
        The effect's record as stored.

    Raises:
        NotFound: no such run or item, or no record of the effect.
        InvalidInput: the effect is not open (applied, or failed): nothing to resolve.
        NotClaimable: a worker holds the item now; try again when it lets go.
        RunClosed: the run grants no lease; resume it first.
    """
    check_resolve(run_id, item_id, name, worker)
    key = idempotency_key(run_id, item_id, name)
    record = store.effect(run_id, item_id, key)
    context: dict[str, Any] = {"run_id": run_id, "item_id": item_id}
    if record is None:
        raise NotFound(f"effect {key!r} has no record: it was never sent", **context)
    if record.get("state") not in ("intended", "unknown"):
        raise InvalidInput(
            f"effect {key!r} is {record.get('state')}, not unknown: nothing to settle", **context
        )
    _check_claimable(store, run_id, item_id)  # before the requeue writes anything
    store.requeue(run_id, [item_id])
    lease = store.claim(run_id, item_id, worker, ttl=60.0)
    try:
        state, detail = ("applied", result) if applied else ("failed", f"not applied: {worker}")
        _, stored = store.record_effect(lease, key, name, state, detail)
    finally:
        store.release(lease)
    return stored


def _check_claimable(store: LeaseStore, run_id: str, item_id: str) -> None:
    """Raises RunClosed when the item's shard grants no lease now, NotClaimable when a
    live lease holds the item: what would refuse the claim after the requeue had written."""
    context: dict[str, Any] = {"run_id": run_id, "item_id": item_id}
    shard = store.shard_for(run_id, item_id)
    meta = store.keys.shard(run_id, shard)[0]
    with store.translating_errors(run_id):
        pipe = store.client.pipeline(transaction=not store.on_cluster)
        pipe.hmget(meta, "closed", "deadline_at")
        queue_time(pipe)
        (closed, deadline), now = pipe.execute()
    now_ms = time_ms(now)
    deadline_ms = int(deadline or 0)
    if closed in (b"1", "1"):
        raise RunClosed(f"run {run_id!r} is closed: resume it first", reason="closed", **context)
    if 0 < deadline_ms <= now_ms:
        raise RunClosed(
            f"run {run_id!r} is past its deadline: resume it first",
            reason="deadline",
            deadline_ms=deadline_ms,
            **context,
        )
    record = store.item(run_id, item_id)
    if record.state == "leased" and (record.expires_at_ms or 0) > now_ms:
        raise NotClaimable(
            f"item {item_id!r} is held by {record.owner or 'a worker'}: try again when it lets go",
            state="leased",
            until_ms=record.expires_at_ms,
            **context,
        )
