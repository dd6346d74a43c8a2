"""Claims: a lease granted on a named item or on the next due ones (``claim.lua``,
``claim_next.lua``), each with a fencing token and a lease id."""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Sequence
from typing import Any

from ...errors import InvalidInput, NotClaimable, NotReplicated
from ...limits import DEFAULT_TTL
from .. import tracing
from ..connection.translate import REDIS_FAILURES
from ..leases import Lease
from ..replies import Grant
from ..scripts import Call
from ..validation import clip
from .call_checks import check_claim
from .store_client import StoreBase


def lease_base() -> str:
    """A new lease id, or the base of a batch's (``<base>.<n>``): 64 random bits as 16 hex
    characters. The token fences; the lease id tells two grants of one item apart even
    when Redis lost the item's token (restarted empty), and is short because every record,
    claim reply and settle call carries it."""
    return secrets.token_hex(8)


class StoreClaims(StoreBase):
    """The claims of a store (see :class:`~.lease_store.LeaseStore`)."""

    def _lease(self, run_id: str, shard: int, worker: str, grant: Grant) -> Lease:
        return Lease(
            run_id=run_id,
            item_id=grant.item_id,
            shard=shard,
            token=grant.token,
            lease_id=grant.lease_id,
            expires_at_ms=grant.expires_at_ms,
            attempt=grant.attempt,
            payload=json.loads(grant.payload) if grant.payload else None,
            takeover=grant.takeover,
            worker=worker,
            trace_id=tracing.trace_id(),
        )

    def _hold_back(
        self,
        name: str,
        run_id: str,
        shard: int,
        reply: Any,
        keys: list[str],
        args: Sequence[Any],
    ) -> str:
        """Gives back the leases of a claim the replicas did not acknowledge, in one round
        trip (``release``: due again at once, the attempt not counted, the token kept).

        Nobody saw their tokens, so none is held: a failover that loses the claim grants
        the same token again to its first holder. Safe to fail and to repeat: a release
        that does not land (Redis went away, or the lease was taken over meanwhile) leaves
        the lease to run out by its expiry, as for a claim whose reply was lost.
        """
        if name not in ("claim", "claim_next"):
            return super()._hold_back(name, run_id, shard, reply, keys, args)
        grants: list[Grant] = reply if isinstance(reply, list) else [reply]
        if not grants:
            return ""
        calls = [Call("release", keys, [g.item_id, g.token, g.lease_id, 0, ""]) for g in grants]
        try:
            answers = self.scripts.many(calls)
        except REDIS_FAILURES:
            return f" (giving back its {len(grants)} lease(s) failed: they run out by expiry)"
        given = sum(not isinstance(answer, Exception) for answer in answers)
        return f" (its {len(grants)} lease(s) given back: {given} released)"

    def claim(self, run_id: str, item_id: str, worker: str, ttl: float = DEFAULT_TTL) -> Lease:
        """Leases one named item.

        Raises:
            NotClaimable: held by another lease (``until_ms``: its expiry), not due, or finished.
            NotFound: no such run or item.
            RunClosed: the run is closed.
            NotReplicated: the store waits for replicas and too few acknowledged the claim in
                time; it was given back (see :meth:`claim_next`).
        """
        ttl_ms = check_claim(run_id, item_id, worker, ttl)
        shard = self.shard_for(run_id, item_id)
        row = self._run_script(
            "claim", run_id, shard, [item_id, worker, lease_base(), ttl_ms], item_id=item_id
        )
        return self._lease(run_id, shard, worker, row)

    def claim_next(
        self,
        run_id: str,
        worker: str,
        *,
        shard: int | None = None,
        limit: int = 1,
        ttl: float = DEFAULT_TTL,
    ) -> list[Lease]:
        """Leases up to ``limit`` due items of ``shard``, or of any shard (from a random one).

        Expired leases are taken over first, then pending items in eligible-time
        order. Returns an empty list when nothing is due.

        Raises:
            NotReplicated: the store waits for replicas (``wait_replicas``) and too few
                acknowledged the first shard's claim in time; its leases were given back.
                When a later shard's claim is not acknowledged, its leases are given back
                and the leases of the shards before it are returned.
        """
        ttl_ms = check_claim(run_id, None, worker, ttl, limit)
        count = self.shard_count(run_id)
        if shard is not None and (not isinstance(shard, int) or isinstance(shard, bool)):
            example = f" (e.g. {shard})" if isinstance(shard, str) and shard.isdigit() else ""
            raise InvalidInput(
                f"invalid shard {clip(repr(shard), 60)} of type {type(shard).__name__}: "
                f"a shard is an int{example}"
            )
        if shard is not None and not 0 <= shard < count:
            raise InvalidInput(
                f"shard {shard} out of range: run {run_id!r} has shards 0-{count - 1}"
            )
        start = random.randrange(count)
        order = [shard] if shard is not None else [(start + i) % count for i in range(count)]
        leases: list[Lease] = []
        for number in order:
            try:
                rows = self._run_script(
                    "claim_next",
                    run_id,
                    number,
                    [worker, lease_base(), ttl_ms, limit - len(leases)],
                )
            except NotReplicated:
                if not leases:
                    raise
                break  # the shards before it were acknowledged: theirs are handed out
            leases.extend(self._lease(run_id, number, worker, row) for row in rows)
            if len(leases) >= limit:
                break
        return leases

    def claim_any(self, run_id: str, worker: str, ttl: float = DEFAULT_TTL) -> Lease:
        """Leases the next due item of any shard; raises NotClaimable when none is due."""
        leases = self.claim_next(run_id, worker, limit=1, ttl=ttl)
        if not leases:
            # no item is meant, so no state: ``state`` is only ever an item's
            raise NotClaimable(f"nothing is due in run {run_id!r}", run_id=run_id, state=None)
        return leases[0]
