"""Kept where it was, because users' code imports it: the code lives in
:mod:`redis_lease.fleet.effects`, whose public names this module hands on."""

from .fleet.effects import (
    CONNECT_ERRORS,
    KEY_MAX_LENGTH,
    NOT_CONNECTED,
    SEPARATOR,
    EffectFailed,
    EffectUnknown,
    NeedsReconciliation,
    Throttled,
    apply_effect,
    check_resolve,
    idempotency_key,
    not_sent,
    resolve_effect,
)

__all__ = [
    "CONNECT_ERRORS",
    "KEY_MAX_LENGTH",
    "NOT_CONNECTED",
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
