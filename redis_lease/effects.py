"""Effects under the fence: idempotency keys, the effect ledger, reconciliation.

An external effect (a payment correction, an email) is recorded per item by its
idempotency key, written only under the current lease::

    intended (before the call) -> applied (with the provider's reference)
                               -> failed  (definite: the provider did nothing)
                               -> unknown (timeout, reset, 5xx after sending)

The key is ``<run id>|<item id>|<effect>`` (the run id is ``<job>:<date>``),
never from the token or attempt, so a stale worker and the new owner send the
same key to the provider. Ids cannot contain ``|``, so no two (run, item,
effect) triples share a key. Ledgers written before this encoding keep their
keys (``<run>:<item>:<effect>``): :func:`apply_effect` goes on using an old
key that holds the same item's effect.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import EffectFailed, EffectUnknown, NeedsReconciliation, Throttled
from .limits import bound
from .store import LeaseStore
from .validation import check_id

if TYPE_CHECKING:
    from .lease import Lease

__all__ = [
    "KEY_MAX_LENGTH",
    "SEPARATOR",
    "EffectFailed",
    "EffectUnknown",
    "NeedsReconciliation",
    "Throttled",
    "apply_effect",
    "idempotency_key",
]

#: The protocol's longest key; providers commonly accept keys of up to 255 characters.
KEY_MAX_LENGTH = bound("key_length")[1]
#: Joins run, item and effect: a character no id may contain.
SEPARATOR = "|"
_DIGEST_LENGTH = 64  # SHA-256 in hex


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


def _legacy_key(run_id: str, item_id: str, effect: str) -> str:
    """The key earlier versions used (``:``-joined, ambiguous); read, never newly written."""
    return _bounded(f"{run_id}:{item_id}:{effect}")


def _bounded(key: str) -> str:
    if len(key) <= KEY_MAX_LENGTH:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{key[: KEY_MAX_LENGTH - _DIGEST_LENGTH - 1]}~{digest}"


def apply_effect(
    store: LeaseStore,
    lease: Lease,
    name: str,
    call: Callable[[str], Any],
    *,
    lookup: Callable[[str], Any] | None = None,
    honours_keys: bool = False,
) -> Any:
    """Applies an effect at most once per idempotency key, under the fence.

    Args:
        call: sends the effect with the key; returns the provider's result (JSON).
            It raises EffectFailed (or Throttled) when the provider did nothing,
            EffectUnknown (or anything else) when the outcome is ambiguous.
        lookup: asks the provider for the key's outcome: the result when it was
            applied, None when it was not; raises EffectUnknown when it cannot tell.
        honours_keys: the provider dedupes by key, so a retry with the same key is safe.

    Returns:
        The provider's result, the stored one when the effect was applied before.

    Raises:
        LeaseLost: the lease is no longer held (nothing is sent then).
        NeedsReconciliation: an earlier attempt is ambiguous and cannot be resolved.
    """
    key = idempotency_key(lease.run_id, lease.item_id, name)
    # One round trip records the intent, or returns the open record untouched. An upgrade
    # mid-run must not send an effect again under a new key, so a record under the old key
    # that belongs to this item and effect wins.
    previous, record, key = store.begin_effect(
        lease, key, name, _legacy_key(lease.run_id, lease.item_id, name)
    )
    if previous == "applied":
        return record.get("result")
    if previous in ("intended", "unknown"):
        # An earlier attempt may have reached the provider: reconcile before re-issuing.
        if lookup is not None:
            found = lookup(key)
            if found is not None:
                _, stored = store.record_effect(lease, key, name, "applied", found)
                return stored.get("result")
        elif not honours_keys:
            raise NeedsReconciliation(
                f"needs reconciliation: effect {key!r} was {previous} and the provider "
                "can neither dedupe by key nor be asked",
                run_id=lease.run_id,
                item_id=lease.item_id,
                token=lease.token,
            )
        store.record_effect(lease, key, name, "intended", None)
    try:
        result = call(key)
    except EffectFailed as error:
        store.record_effect(lease, key, name, "failed", f"{type(error).__name__}: {error}")
        raise
    except BaseException as error:
        store.record_effect(lease, key, name, "unknown", f"{type(error).__name__}: {error}")
        raise
    _, stored = store.record_effect(lease, key, name, "applied", result)
    return stored.get("result")
