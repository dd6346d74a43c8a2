"""Kept where it was, because users' code imports it: the code lives in
:mod:`redis_lease.protocol.store.lease_store`, whose public names this module hands on."""

from .protocol.store.lease_store import (
    Attempt,
    CommitRequest,
    FailRequest,
    LeaseError,
    LeaseStore,
    ReleaseRequest,
    effect_record,
    lease_base,
)

__all__ = [
    "Attempt",
    "CommitRequest",
    "FailRequest",
    "LeaseError",
    "LeaseStore",
    "ReleaseRequest",
    "effect_record",
    "lease_base",
]
