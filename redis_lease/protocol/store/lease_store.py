"""LeaseStore: fenced leases on items of runs, one Lua script per operation.

Its plumbing (clients, keys, scripts, error translation) is :class:`~.store_base.StoreBase`,
its plain reads (records, attempts, effects, status) :class:`~.store_reads.StoreReads`.
"""

from __future__ import annotations

import json
import random
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any

import redis

from ...deprecation import warn_renamed
from ...errors import InvalidInput, LeaseError, NotClaimable, RedisUnavailable
from ...limits import (
    DEFAULT_BACKOFF_BASE,
    DEFAULT_BACKOFF_CAP,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_SWEEP,
    DEFAULT_TTL,
    RUNNING,
    SWEEP_MAX,
)
from .. import guards, tracing
from ..keys import shard_of
from ..replies import Cut, Grant
from ..scripts import Call, Command
from ..validation import (
    check_id,
    check_positive,
    check_time_ms,
    delay_to_ms,
    encode_json,
    ttl_to_ms,
)
from ..values import (
    Attempt,
    CommitReply,
    CommitRequest,
    FailReply,
    FailRequest,
    Item,
    Lease,
    ReleaseRequest,
    SettleRequest,
    effect_record,
)
from . import settle
from .add import added_counts, added_ids
from .call_checks import check_add, check_claim, check_ref, check_run, check_sweep
from .reads import StoreReads


def lease_base() -> str:
    """A new lease id, or the base of a batch's (``<base>.<n>``): 64 random bits as 16 hex
    characters. The token fences; the lease id tells two grants of one item apart even
    when Redis lost the item's token (restarted empty), and is short because every record,
    claim reply and settle call carries it."""
    return secrets.token_hex(8)


class LeaseStore(StoreReads):
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
        batches per shard, many batches per round trip (:mod:`.adding`). The settings
        (attempts, backoff, the deadline after which no lease is granted; None for none)
        are fixed by a shard's first add; :meth:`set_deadline` moves the deadline later.
        """
        items = list(items)
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

        For many items read from a file: each id as :func:`~.validation.check_id` passed
        it, each text as :func:`~.validation.encode_json` made it, so that nothing is
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

    # -- leases ---------------------------------------------------------------

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

    def claim(self, run_id: str, item_id: str, worker: str, ttl: float = DEFAULT_TTL) -> Lease:
        """Leases one named item.

        Raises:
            NotClaimable: held by another lease (``until_ms``: its expiry), not due, or finished.
            NotFound: no such run or item.
            RunClosed: the run is closed.
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
        """
        ttl_ms = check_claim(run_id, None, worker, ttl, limit)
        count = self.shard_count(run_id)
        if shard is not None and not 0 <= shard < count:
            raise InvalidInput(
                f"shard {shard} out of range: run {run_id!r} has shards 0-{count - 1}"
            )
        start = random.randrange(count)
        order = [shard] if shard is not None else [(start + i) % count for i in range(count)]
        leases: list[Lease] = []
        for number in order:
            rows = self._run_script(
                "claim_next",
                run_id,
                number,
                [worker, lease_base(), ttl_ms, limit - len(leases)],
            )
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

    def renew(self, lease: Lease, ttl: float = DEFAULT_TTL) -> Lease:
        """Extends a lease from now; only its holder may. Raises LeaseLost."""
        ttl_ms = ttl_to_ms(ttl)
        reply = self._holder_script("renew", lease, [ttl_ms, lease.trace_id])
        return settle.extended(lease, reply)

    def renew_many(self, leases: Sequence[Lease], ttl: float = DEFAULT_TTL) -> list[Lease | None]:
        """Renews several leases in one round trip, one script call per shard; None where a
        lease was lost."""
        return self.renew_with(leases, ttl)[0]

    def renew_with(
        self, leases: Sequence[Lease], ttl: float = DEFAULT_TTL, commands: Sequence[Command] = ()
    ) -> tuple[list[Lease | None], list[Any]]:
        """:meth:`renew_many` with plain commands in the same round trip (a heartbeat, a
        read); returns the leases (None where lost) and the commands' raw replies."""
        ttl_ms = ttl_to_ms(ttl)
        for lease in leases:
            settle.check_holder(lease)
        groups: list[settle.Group] = [("renew", lease, ttl_ms, "") for lease in leases]
        answers = self._settle(groups, commands=commands)
        return settle.renewed(leases, answers), answers[len(leases) :]

    def commit(
        self,
        lease: Lease,
        result: Any = None,
        *,
        conditions: Iterable[guards.Condition] = (),
        writes: Iterable[guards.Write] = (),
        label: str = "",
        outcome: str | None = None,
    ) -> CommitReply:
        """Marks the item done with ``result``, applying guarded writes atomically.

        A repeated commit with the same token and lease id returns what the first stored.
        ``label`` names the commit (e.g. ``released``); the run counts it as
        ``outcome_<label>``. ``outcome`` is the deprecated name of ``label``.

        Raises:
            LeaseLost: the caller is not the holder; nothing was written.
            ConditionFailed: a condition did not hold; nothing was written and the lease is kept.
        """
        if outcome is not None:
            warn_renamed("LeaseStore.commit(outcome=...)", "LeaseStore.commit(label=...)")
            label = outcome
        request = CommitRequest(lease, result, tuple(conditions), tuple(writes), label)
        extra, args = settle.commit_args(request)
        reply: CommitReply = self._holder_script("commit", lease, args, extra_keys=extra)
        return reply

    def commit_many(self, requests: Sequence[CommitRequest]) -> list[CommitReply | LeaseError]:
        """Commits several items in one round trip, each fenced on its own.

        Returns, per request, its CommitReply or the LeaseError that refused it
        (LeaseLost, ConditionFailed, ...); a request that is not valid (a result that
        is not JSON or too large, a bad token) gets its InvalidInput and is not sent.
        """
        answers = self.settle_many(requests)
        return [a for a in answers if isinstance(a, CommitReply | LeaseError)]

    def settle_many(
        self, requests: Sequence[SettleRequest]
    ) -> list[CommitReply | FailReply | LeaseError | None]:
        """Commits, fails and releases several items in one round trip, each fenced on its own.

        The requests of one shard go in one script call (a commit with guarded writes
        goes alone). Returns, per request, its CommitReply, FailReply, None for a
        release, or the LeaseError that refused it (LeaseLost, NotFound, ConditionFailed);
        a request that is not valid gets its InvalidInput and is not sent.
        """
        batch = settle.encode(self.keys, requests)
        replies = self._settle(batch.groups, batch.alone)
        return settle.answers_of(len(requests), batch, replies)

    def _settle(
        self,
        groups: Sequence[settle.Group],
        alone: Sequence[tuple[Lease, Call]] = (),
        commands: Sequence[Command] = (),
    ) -> list[Any]:
        """Sends the settle groups (operation, lease, detail, option), one call per shard
        (at most BATCH_MAX groups each), the ``alone`` calls (each with the lease it is
        about) and plain ``commands``, in one round trip.

        Returns per group, then per ``alone`` call, its decoded reply or its LeaseError,
        then per command its raw reply; raises when the server refused the user or went
        away (not one item's fault).
        """
        settles, members = settle.shard_calls(self.keys, groups)
        calls: list[Call | Command] = [*settles, *(call for _, call in alone), *commands]
        if not calls:
            return []
        with self.translating_errors():
            replies = self.scripts.many(calls)
        answers, refused_whole = settle.read(
            groups, members, alone, replies[: len(replies) - len(commands)], self._answer
        )
        if refused_whole:  # nothing of those calls was written: each group alone says whose it is
            for i, answer in zip(
                refused_whole, self._settle_alone(groups, refused_whole), strict=True
            ):
                answers[i] = answer
        return answers + replies[len(replies) - len(commands) :]

    def _settle_alone(self, groups: Sequence[settle.Group], indexes: list[int]) -> list[Any]:
        """Sends each of the groups at ``indexes`` in a settle call of its own (one round
        trip); returns their answers, a refusal only for the group it is about."""
        with self.translating_errors():
            replies = self.scripts.many(settle.alone_calls(self.keys, groups, indexes))
        return [
            self._answer(settle.alone_row(reply), groups[i][1])
            for i, reply in zip(indexes, replies, strict=True)
        ]

    def _answer(self, reply: Any, lease: Lease) -> Any:
        """A settle row or a reply, with an error reply as its LeaseError."""
        if not isinstance(reply, redis.ResponseError):
            return reply
        error = self.translating_errors(lease.run_id, lease.item_id, lease.token).error(reply)
        if not isinstance(error, LeaseError) or isinstance(error, RedisUnavailable):
            raise error  # the server refused the user or went away: not one item's fault
        return error

    def fail(self, lease: Lease, error: str, *, permanent: bool = False) -> FailReply:
        """Reports a failed attempt: retried with backoff, or dead. Raises LeaseLost."""
        text = settle.error_text(error)
        failed: FailReply = self._holder_script(
            "fail",
            lease,
            [text, "1" if permanent else "0", f"{random.random():.6f}", lease.trace_id],
        )
        return failed

    def release(self, lease: Lease, delay: float = 0.0) -> None:
        """Gives the item back unprocessed, due at once or after ``delay`` seconds.

        The attempt is not counted. Raises LeaseLost; InvalidInput for a delay
        outside the protocol's bound (at most limits.DELAY_MAX_MS).
        """
        delay_ms = delay_to_ms(delay) if delay else 0
        self._holder_script("release", lease, [delay_ms, lease.trace_id])

    def _holder_script(
        self, name: str, lease: Lease, args: Sequence[Any], extra_keys: Sequence[str] = ()
    ) -> Any:
        settle.check_holder(lease)
        return self._run_script(
            name,
            lease.run_id,
            lease.shard,
            [lease.item_id, lease.token, lease.lease_id, *args],
            item_id=lease.item_id,
            token=lease.token,
            extra_keys=extra_keys,
        )

    def record_effect(
        self, lease: Lease, key: str, name: str, state: str, detail: Any = None
    ) -> tuple[str, dict[str, Any]]:
        """Writes the effect record ``key`` under the fence; returns (previous state, record).

        An applied record is final: it is returned unchanged. Raises LeaseLost.
        """
        recorded = self._effect_script(lease, key, name, state, detail)
        return recorded.previous, effect_record(recorded.record)

    def begin_effect(
        self, lease: Lease, key: str, name: str, earlier_key: str = ""
    ) -> tuple[str, dict[str, Any], str]:
        """Records the intent of an effect unless an attempt is open; one round trip.

        Returns (previous state, record, key used). The record is returned unchanged when
        it is applied, intended or unknown (``previous`` is then its state and nothing was
        written); ``earlier_key`` is used instead of ``key`` when only it holds this item's
        effect. Raises LeaseLost.
        """
        recorded = self._effect_script(lease, key, name, "intended", None, "1", earlier_key)
        return recorded.previous, effect_record(recorded.record), recorded.key or key

    def _effect_script(self, lease: Lease, key: str, name: str, state: str, detail: Any,
                       fresh: str = "", earlier_key: str = "") -> Any:  # fmt: skip
        detail_text = encode_json(detail, "effect detail")
        return self._holder_script(
            "record_effect",
            lease,
            [key, name, state, detail_text, fresh, earlier_key, lease.trace_id],
            extra_keys=self.keys.effects(lease.run_id, lease.shard),
        )

    def lease_ref(
        self, run_id: str, item_id: str, token: int, lease_id: str = "", trace_id: str = ""
    ) -> Lease:
        """A Lease for an item by token (for callers that kept only the token); see
        :meth:`Lease.from_token`. Its ids, token and trace id are checked before its shard is
        looked up: InvalidInput comes before NotFound."""
        ref = check_ref(run_id, item_id, token, lease_id, trace_id)
        return replace(ref, shard=self.shard_for(run_id, item_id))

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
        the next claim takes their items over. Returns how many, and when.

        Raises:
            NotFound: the run does not exist.
        """
        check_positive(limit, "limit", SWEEP_MAX)
        check_id(owner, "owner")
        self.shard_count(run_id)  # NotFound for a run that is gone
        cut: Cut = self._run_script("cut_leases", run_id, shard, [owner, limit])
        return cut

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
]
