"""What a lease's holder does with it, each call fenced by its token and lease id: renew,
commit (with guarded writes), fail, release, do many of those at once, and record
effects."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

import redis

from ...errors import LeaseError, RedisUnavailable
from ...limits import DEFAULT_TTL
from .. import guards
from ..leases import CommitReply, CommitRequest, FailReply, Lease, SettleRequest, effect_record
from ..scripts import Call, Command
from ..validation import delay_to_ms, encode_json, ttl_to_ms
from . import settle_encoding
from .call_checks import check_ref
from .store_client import StoreBase


class StoreHolder(StoreBase):
    """A holder's calls of a store (see :class:`~.lease_store.LeaseStore`)."""

    def renew(self, lease: Lease, ttl: float = DEFAULT_TTL) -> Lease:
        """Extends a lease from now; only its holder may. Raises LeaseLost."""
        ttl_ms = ttl_to_ms(ttl)
        reply = self._holder_script("renew", lease, [ttl_ms, lease.trace_id])
        return settle_encoding.extended(lease, reply)

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
            settle_encoding.check_holder(lease)
        groups: list[settle_encoding.Group] = [("renew", lease, ttl_ms, "") for lease in leases]
        answers = self._settle(groups, commands=commands)
        return settle_encoding.renewed(leases, answers), answers[len(leases) :]

    def commit(
        self,
        lease: Lease,
        result: Any = None,
        *,
        conditions: Iterable[guards.Condition] = (),
        writes: Iterable[guards.Write] = (),
        label: str = "",
    ) -> CommitReply:
        """Marks the item done with ``result``, applying guarded writes atomically.

        A repeated commit with the same token and lease id returns what the first stored.
        ``label`` names the commit (e.g. ``released``); the run counts it as
        ``outcome_<label>``.

        Raises:
            LeaseLost: the caller is not the holder; nothing was written.
            ConditionFailed: a condition did not hold; nothing was written and the lease is kept.
        """
        request = CommitRequest(lease, result, tuple(conditions), tuple(writes), label)
        extra, args = settle_encoding.commit_args(request)
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
        batch = settle_encoding.encode(self.keys, requests)
        replies = self._settle(batch.groups, batch.alone)
        return settle_encoding.answers_of(len(requests), batch, replies)

    def _settle(
        self,
        groups: Sequence[settle_encoding.Group],
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
        settles, members = settle_encoding.shard_calls(self.keys, groups)
        calls: list[Call | Command] = [*settles, *(call for _, call in alone), *commands]
        if not calls:
            return []
        with self.translating_errors():
            replies = self.scripts.many(calls)
        answers, refused_whole = settle_encoding.read(
            groups, members, alone, replies[: len(replies) - len(commands)], self._answer
        )
        if refused_whole:  # nothing of those calls was written: each group alone says whose it is
            for i, answer in zip(
                refused_whole, self._settle_alone(groups, refused_whole), strict=True
            ):
                answers[i] = answer
        return answers + replies[len(replies) - len(commands) :]

    def _settle_alone(
        self, groups: Sequence[settle_encoding.Group], indexes: list[int]
    ) -> list[Any]:
        """Sends each of the groups at ``indexes`` in a settle call of its own (one round
        trip); returns their answers, a refusal only for the group it is about."""
        with self.translating_errors():
            replies = self.scripts.many(settle_encoding.alone_calls(self.keys, groups, indexes))
        return [
            self._answer(settle_encoding.alone_row(reply), groups[i][1])
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
        text = settle_encoding.error_text(error)
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
        settle_encoding.check_holder(lease)
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
        self,
        lease: Lease,
        key: str,
        name: str,
        state: str,
        detail: Any = None,
        *,
        ttl: float | None = None,
    ) -> tuple[str, dict[str, Any]]:
        """Writes the effect record ``key`` under the fence; returns (previous state, record).

        An applied record is final: it is returned unchanged. With ``ttl``, writing
        ``intended`` also renews the lease for ``ttl`` seconds in the same call (the check
        right before the provider call). Raises LeaseLost.
        """
        recorded = self._effect_script(lease, key, name, state, detail, ttl=ttl)
        return recorded.previous, effect_record(recorded.record)

    def begin_effect(
        self, lease: Lease, key: str, name: str, earlier_key: str = "", *, ttl: float | None = None
    ) -> tuple[str, dict[str, Any], str]:
        """Records the intent of an effect unless an attempt is open; one round trip.

        Returns (previous state, record, key used). The record is returned unchanged when
        it is applied, intended or unknown (``previous`` is then its state and nothing was
        written); ``earlier_key`` is used instead of ``key`` when only it holds this item's
        effect. In a shard marked after a loss of data (:meth:`set_after_loss`) an effect
        with no record may have been applied: it is recorded ``unknown`` (with
        ``after_loss`` true) and returned as ``unknown``. With ``ttl``, recording the
        intent renews the lease for ``ttl`` seconds. Raises LeaseLost.
        """
        recorded = self._effect_script(lease, key, name, "intended", None, "1", earlier_key, ttl)
        return recorded.previous, effect_record(recorded.record), recorded.key or key

    def _effect_script(self, lease: Lease, key: str, name: str, state: str, detail: Any,
                       fresh: str = "", earlier_key: str = "",
                       ttl: float | None = None) -> Any:  # fmt: skip
        detail_text = encode_json(detail, "effect detail")
        ttl_ms = ttl_to_ms(ttl) if ttl is not None else ""
        return self._holder_script(
            "record_effect",
            lease,
            [key, name, state, detail_text, fresh, earlier_key, lease.trace_id, ttl_ms],
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
