"""What each store call checks before anything reaches Redis, in the call's order.

The store runs these checks first. The command line runs the same ones before it connects.
So a bad value is refused with the same message from the library and from the CLI.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from ...errors import InvalidInput
from ...limits import (
    BATCH_MAX,
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    SHARD_COUNT_MAX,
    SWEEP_MAX,
)
from ..leases import Lease
from ..validation import check_id, check_positive, ttl_to_ms
from .add import AddSettings
from .settle_encoding import check_holder


def check_run(run_id: str, shards: int | None = None) -> int:
    """The run id and the wanted shard count (1 when None), as a run is created."""
    check_id(run_id, "run id")
    return check_positive(shards if shards is not None else 1, "shards", SHARD_COUNT_MAX)


def check_add(
    run_id: str,
    item_ids: Iterable[str] = (),
    *,
    shards: int | None = None,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    backoff_base: float = DEFAULT_BACKOFF_BASE,
    backoff_cap: float = DEFAULT_BACKOFF_CAP,
    deadline_ms: int | None = None,
) -> AddSettings:
    """An add's settings, its item ids and its run (:meth:`.lease_store.LeaseStore.add`);
    returns the settings as the script takes them."""
    settings = AddSettings.checked(max_attempts, backoff_base, backoff_cap, deadline_ms)
    for item_id in item_ids:
        check_id(item_id, "item id")
    check_run(run_id, shards)
    return settings


def check_claim(run_id: str, item_id: str | None, worker: str, ttl: float, limit: int = 1) -> int:
    """A claim's worker, batch size, TTL, item (None: the next due) and run; returns the
    TTL in ms."""
    check_id(worker, "worker")
    check_positive(limit, "limit", BATCH_MAX)
    ttl_ms = ttl_to_ms(ttl)
    if item_id is not None:
        check_id(item_id, "item id")
    check_id(run_id, "run id")
    return ttl_ms


def check_ref(
    run_id: str, item_id: str, token: int, lease_id: str = "", trace_id: str = ""
) -> Lease:
    """A lease known by its token: its ids, token and trace id; returns it in shard 0 (the
    store looks its shard up)."""
    ref = replace(Lease.from_token(run_id, item_id, 0, token, lease_id), trace_id=trace_id)
    check_holder(ref)
    return ref


def check_sweep(run_id: str, limit: int, item_ids: Sequence[str] = ()) -> None:
    """A reap's or requeue's bound per shard, the items it names and its run."""
    check_positive(limit, "limit", SWEEP_MAX)
    if len(item_ids) > SWEEP_MAX:
        raise InvalidInput(f"at most {SWEEP_MAX} items per requeue; split the list")
    for item_id in item_ids:
        check_id(item_id, "item id")
    check_id(run_id, "run id")


__all__ = ["check_add", "check_claim", "check_ref", "check_run", "check_sweep"]
