"""LeaseStore: fenced leases on items of runs, one Lua script per operation.

This module holds runs and their items (creating, adding) and the maintenance of leases
(reaping, cutting, requeueing, closing, deadlines). The rest is split by concept: the
plumbing (clients, keys, scripts, error translation) is :class:`~.store_client.StoreBase`, claims
:class:`~.claims.StoreClaims`, what a lease's holder does (renew, commit, fail, release,
settle, effects) :class:`~.holder.StoreHolder`, the plain reads (records, attempts,
effects, status) :class:`~.reads.StoreReads`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from ...errors import InvalidInput, LeaseError
from ...limits import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SWEEP,
    RUNNING,
    SWEEP_MAX,
)
from ..keys import shard_of
from ..leases import Attempt, CommitRequest, FailRequest, Item, ReleaseRequest, effect_record
from ..replies import Cut
from ..validation import check_id, check_positive, check_time_ms, encode_json
from .add import added_counts, added_ids
from .call_checks import check_add, check_run, check_sweep
from .claims import StoreClaims, lease_base
from .holder import StoreHolder
from .reads import StoreReads


class LeaseStore(StoreClaims, StoreHolder, StoreReads):
    """Runs, items and fenced leases in one Redis database.

    Args:
        client: a redis-py client (or a fakeredis one, or a RedisCluster).
        prefix: the key prefix; stores with different prefixes never meet.
        url: the URL the client came from, used in error messages.
        rq_client: the Redis of RQ's queues, jobs and workers when it is not ``client``:
            required with a cluster, where RQ does not run (see :attr:`rq`).
    """

    # -- runs and items -------------------------------------------------------

    def create_run(
        self,
        run_id: str,
        shards: int | None = None,
        *,
        state: str = RUNNING,
        fields: dict[str, str] | None = None,
    ) -> tuple[bool, int]:
        """Creates the run once; returns (created now, shard count).

        ``state`` and ``fields`` are stored only when the run is created now.
        Raises InvalidInput when ``shards`` differs from an existing run's count.
        """
        wanted = check_run(run_id, shards)
        extra = [part for pair in (fields or {}).items() for part in pair]
        with self.translating_errors(run_id):
            created, count, created_at = self.scripts.call(
                "create_run", [self.keys.run(run_id)], [run_id, wanted, state, *extra]
            )
            self.client.zadd(self.keys.runs, {run_id: created_at}, nx=True)
        if shards is not None and count != shards:
            raise InvalidInput(
                f"run {run_id!r} has {count} shards, not {shards}; omit --shards or pass {count}",
                run_id=run_id,
            )
        self._shards[run_id] = int(count)
        return bool(created), int(count)

    def add(
        self,
        run_id: str,
        items: Iterable[Item],
        *,
        shards: int | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_cap: float = DEFAULT_BACKOFF_CAP,
        deadline_ms: int | None = None,
    ) -> tuple[list[str], list[str]]:
        """Adds items to a run (creating it); returns (added ids, ids that existed).

        Every item is validated before anything is written. Items go to Redis in
        batches per shard, many batches per round trip (:mod:`.add`). The settings
        (attempts, backoff, the deadline after which no lease is granted; None for none)
        are fixed by a shard's first add; :meth:`set_deadline` moves the deadline later.
        """
        items = list(items)
        for position, item in enumerate(items, 1):
            if not isinstance(item, Item):
                raise InvalidInput(
                    f"item {position} is a {type(item).__name__}, not a redis_lease.Item: "
                    "give Item(id, payload)"
                )
        settings = check_add(
            run_id,
            [i.id for i in items],
            shards=shards,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            deadline_ms=deadline_ms,
        )
        checked = [(i.id, encode_json(i.payload)) for i in items]
        if not checked:
            raise InvalidInput("no items given; name at least one item")
        self.create_run(run_id, shards)
        return added_ids(self, run_id, dict(checked).items(), settings)

    def add_checked(
        self,
        run_id: str,
        pairs: Iterable[tuple[str, str]],
        *,
        shards: int | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff_base: float = DEFAULT_BACKOFF_BASE,
        backoff_cap: float = DEFAULT_BACKOFF_CAP,
        deadline_ms: int | None = None,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[int, int]:
        """Adds items checked already, (item id, payload JSON text) pairs read as they are
        sent (creating the run); returns (added, already there): an id given twice counts
        once as added, then as already there. The settings are :meth:`add`'s; ``progress``
        hears how many pairs each round of round trips took.

        For many items read from a file: each id as :func:`~..validation.check_id` passed
        it, each text as :func:`~..validation.encode_json` made it, so that nothing is
        checked twice here. The scripts check them again: a bad pair is refused
        (InvalidInput) with its calls, after the calls before them added theirs.
        """
        settings = check_add(
            run_id,
            shards=shards,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
            backoff_cap=backoff_cap,
            deadline_ms=deadline_ms,
        )
        self.create_run(run_id, shards)
        return added_counts(self, run_id, pairs, settings, progress)

    # -- maintenance ----------------------------------------------------------

    def reap(self, run_id: str, limit: int = DEFAULT_SWEEP) -> tuple[int, int]:
        """Moves expired leases of every shard back to pending (or dead); returns the counts."""
        check_sweep(run_id, limit)
        to_pending = to_dead = 0
        for shard in range(self.shard_count(run_id)):
            reaped = self._run_script("reap", run_id, shard, [limit])
            to_pending, to_dead = to_pending + reaped.to_pending, to_dead + reaped.to_dead
        return to_pending, to_dead

    def cut_leases(self, run_id: str, shard: int, owner: str, limit: int = DEFAULT_SWEEP) -> Cut:
        """Ends now every lease ``owner`` holds in one shard (its worker stopped beating);
        the next claim takes their items over. Returns how many, and when (the first call's
        server time).

        The shard's live leases are looked at ``limit`` at a time, one round trip each,
        until all have been (``cut_leases.lua``).

        Raises:
            NotFound: the run does not exist.
        """
        check_positive(limit, "limit", SWEEP_MAX)
        check_id(owner, "owner")
        self.shard_count(run_id)  # NotFound for a run that is gone
        first: Cut = self._run_script("cut_leases", run_id, shard, [owner, limit, ""])
        cut, cursor = first.leases, first.cursor
        while cursor:
            more: Cut = self._run_script("cut_leases", run_id, shard, [owner, limit, cursor])
            cut, cursor = cut + more.leases, more.cursor
        return Cut(cut, first.now_ms)

    def requeue(self, run_id: str, item_ids: Sequence[str] = (), limit: int = DEFAULT_SWEEP) -> int:
        """Moves dead items (named, or up to ``limit`` per shard) back to pending."""
        check_sweep(run_id, limit, item_ids)
        count = self.shard_count(run_id)
        named: dict[int, list[str]] = {}
        for item_id in item_ids:
            named.setdefault(shard_of(item_id, count), []).append(item_id)
        shards = sorted(named) if item_ids else range(count)
        return sum(
            int(self._run_script("requeue", run_id, shard, [limit, *named.get(shard, [])]))
            for shard in shards
        )

    def set_closed(self, run_id: str, closed: bool) -> None:
        """Closes every shard of the run to claims, or reopens them."""
        for shard in range(self.shard_count(run_id)):
            self._run_script("close_shard", run_id, shard, ["1" if closed else "0", ""])

    def set_after_loss(self, run_id: str) -> None:
        """Marks every shard of the run as made again after a loss of data, or as one that
        lived through it: its effect ledger may have gone with the loss.

        From then on an effect with no ledger record may have been applied: the next
        attempt reconciles it (``lookup``), sends it only to a provider that honours
        idempotency keys, or stops with NeedsReconciliation (see
        :func:`redis_lease.fleet.effects.ledger.apply_effect`). The mark stays for the run's life.
        Safe to repeat; a run whose items are not added yet is marked before they are.
        Raises NotFound for an unknown run.
        """
        for shard in range(self.shard_count(run_id)):
            self._run_script("close_shard", run_id, shard, ["", "", "1"])

    def set_deadline(self, run_id: str, deadline_ms: int) -> None:
        """Sets the time (server clock, ms) after which no lease is granted; 0 lifts the bar.

        Leases granted before the deadline may still commit; such commits are
        counted as ``late_commits``.
        """
        deadline = check_time_ms(deadline_ms, "deadline_ms")
        for shard in range(self.shard_count(run_id)):
            self._run_script("close_shard", run_id, shard, ["", deadline])


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
