"""Effects under the fence: idempotency keys, the effect ledger, reconciliation.

An external effect (a payment correction, an email) is recorded per item by its
idempotency key, written only under the current lease::

    intended (before the call) -> applied (with the provider's reference)
                               -> failed  (definite: the provider did nothing)
                               -> unknown (timeout, reset, 5xx after sending)

The key comes from the job, business date, item id and effect name (the run id
is ``<job>:<date>``), never from the token or attempt, so a stale worker and
the new owner send the same key to the provider.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .errors import InvalidInput
from .jobs import PermanentError
from .validation import check_id

if TYPE_CHECKING:
    from .lease import Lease
    from .store import LeaseStore

#: Providers commonly accept keys of up to 255 characters.
KEY_MAX_LENGTH = 255


class EffectFailed(Exception):
    """The provider answered definitely that it did not apply the effect."""


class Throttled(EffectFailed):
    """The provider refused for load (HTTP 429 or alike); retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EffectUnknown(Exception):
    """The call may or may not have been applied (timeout, reset, 5xx after sending)."""


class NeedsReconciliation(PermanentError):
    """An earlier attempt's outcome is unknown and the provider can neither dedupe nor be asked."""


def idempotency_key(run_id: str, item_id: str, effect: str) -> str:
    """The effect's key: ``<job>:<business date>:<item id>:<effect>``.

    Stable across retries, tokens and workers. A key longer than 255 characters
    keeps its first 190 and ends with a SHA-256 digest of the whole.
    """
    check_id(effect, "effect name")
    if ":" in effect:  # the last ':' must separate the item from the effect
        raise InvalidInput(f"effect name {effect!r} may not contain ':'")
    key = f"{run_id}:{item_id}:{effect}"
    if len(key) <= KEY_MAX_LENGTH:
        return key
    digest = hashlib.sha256(key.encode()).hexdigest()
    return f"{key[:190]}~{digest}"


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
    record = store.effect(lease.run_id, lease.item_id, key) or {"state": ""}
    if record["state"] == "applied":
        return record.get("result")
    if record["state"] in ("intended", "unknown"):
        # An earlier attempt may have reached the provider: reconcile before re-issuing.
        if lookup is not None:
            found = lookup(key)
            if found is not None:
                _, stored = store.record_effect(lease, key, name, "applied", found)
                return stored.get("result")
        elif not honours_keys:
            raise NeedsReconciliation(
                f"needs reconciliation: effect {key!r} was {record['state']} and the provider "
                "can neither dedupe by key nor be asked"
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
