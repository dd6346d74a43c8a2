"""The settle protocol's encoding: requests as settle groups and calls, replies as answers.

A settle group is seven arguments of the ``settle`` script (operation, item id, token,
lease id, detail, option, the lease's trace id); the groups of one shard go in one call, at most
limits.BATCH_MAX each. A commit with guarded writes goes in a ``commit`` call of its
own. Nothing here talks to Redis: :class:`~redis_lease.LeaseStore` sends what
this module builds and hands back what the server replied.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import InvalidInput, LeaseError, LeaseLost, NotFound
from ...limits import BATCH_MAX, ERROR_MAX_BYTES
from .. import guards
from ..keys import Keys
from ..leases import (
    CommitReply,
    CommitRequest,
    FailReply,
    FailRequest,
    Lease,
    ReleaseRequest,
    SettleRequest,
)
from ..scripts import Call
from ..validation import check_id, check_lease, clip, delay_to_ms, encode_json

#: One settle group: (operation, lease, detail, option).
Group = tuple[str, Lease, Any, Any]

#: What a settled request comes back as (None for a release).
Answer = CommitReply | FailReply | LeaseError | None


@dataclass
class Batch:
    """Requests encoded for one round trip: settle groups, calls sent alone, refusals."""

    groups: list[Group] = field(default_factory=list)
    grouped: list[int] = field(default_factory=list)  # the request index of each group
    alone: list[tuple[Lease, Call]] = field(default_factory=list)
    alone_index: list[int] = field(default_factory=list)  # the request index of each call
    refused: dict[int, InvalidInput] = field(default_factory=dict)  # never sent


def encode(keys: Keys, requests: Sequence[SettleRequest]) -> Batch:
    """The requests as settle groups, guarded commits as calls of their own; a request
    that is not valid is kept in ``refused`` with its InvalidInput."""
    batch = Batch()
    for index, request in enumerate(requests):
        try:
            check_holder(request.lease)
            if isinstance(request, CommitRequest) and (request.conditions or request.writes):
                batch.alone.append((request.lease, guarded_call(keys, request)))
                batch.alone_index.append(index)
            else:
                batch.groups.append(group(request))
                batch.grouped.append(index)
        except InvalidInput as invalid:
            batch.refused[index] = invalid
    return batch


def group(request: SettleRequest) -> Group:
    """A request as a settle group (operation, lease, detail, option); raises InvalidInput."""
    if isinstance(request, CommitRequest):
        result_text = encode_json(request.result, "result")
        label = check_id(request.label, "label") if request.label else ""
        return ("commit", request.lease, result_text, label)
    if isinstance(request, FailRequest):
        option = "permanent" if request.permanent else f"{random.random():.6f}"
        return ("fail", request.lease, error_text(request.error), option)
    if isinstance(request, ReleaseRequest):
        delay_ms = delay_to_ms(request.delay) if request.delay else 0
        return ("release", request.lease, delay_ms, "")
    raise InvalidInput(f"cannot settle a {type(request).__name__}; use CommitRequest, "
                       "FailRequest or ReleaseRequest")  # fmt: skip


def commit_args(request: CommitRequest) -> tuple[list[str], list[Any]]:
    """The guarded keys and the commit script's arguments after the holder's three."""
    result_text = encode_json(request.result, "result")
    label = check_id(request.label, "label") if request.label else ""
    trace = request.lease.trace_id
    if not request.conditions and not request.writes:
        return [], [result_text, "[]", "[]", label, trace]
    extra, conditions, writes = guards.encode(request.conditions, request.writes)
    return extra, [result_text, conditions, writes, label, trace]


def guarded_call(keys: Keys, request: CommitRequest) -> Call:
    """A commit with guarded writes as a ``commit`` call of its own."""
    lease = request.lease
    extra, args = commit_args(request)
    shard_keys = keys.logged(lease.run_id, lease.shard) + extra
    return Call("commit", shard_keys, [lease.item_id, lease.token, lease.lease_id, *args])


def check_holder(lease: Lease) -> None:
    """Raises InvalidInput unless the lease's ids, token and trace id are ones the protocol
    accepts."""
    check_lease(lease)
    if lease.trace_id:
        check_id(lease.trace_id, "trace id")


def error_text(error: str) -> str:
    """A failure's error text, cut to limits.ERROR_MAX_BYTES; raises InvalidInput when empty."""
    if not isinstance(error, str) or not error.strip():
        raise InvalidInput("an error text is required; say what failed")
    return clip(error, ERROR_MAX_BYTES)


def _args(one: Group) -> list[Any]:
    op, lease, detail, option = one
    return [op, lease.item_id, lease.token, lease.lease_id, detail, option, lease.trace_id]


def shard_calls(keys: Keys, groups: Sequence[Group]) -> tuple[list[Call], list[list[int]]]:
    """One settle call per shard (at most BATCH_MAX groups each) and, per call, the
    indexes of its groups."""
    by_shard: dict[tuple[str, int], list[int]] = {}
    for index, (_, lease, _, _) in enumerate(groups):
        by_shard.setdefault((lease.run_id, lease.shard), []).append(index)
    calls: list[Call] = []
    members: list[list[int]] = []
    for (run_id, shard), indexes in by_shard.items():
        for start in range(0, len(indexes), BATCH_MAX):
            chunk = indexes[start : start + BATCH_MAX]
            flat: list[Any] = []
            for i in chunk:
                flat += _args(groups[i])
            calls.append(Call("settle", keys.logged(run_id, shard), flat))
            members.append(chunk)
    return calls, members


def alone_calls(keys: Keys, groups: Sequence[Group], indexes: Sequence[int]) -> list[Call]:
    """The groups at ``indexes``, each in a settle call of its own."""
    calls: list[Call] = []
    for i in indexes:
        lease = groups[i][1]
        calls.append(Call("settle", keys.logged(lease.run_id, lease.shard), _args(groups[i])))
    return calls


def alone_row(reply: Any) -> Any:
    """The one row of a settle call sent alone (or its error reply)."""
    return reply[0] if isinstance(reply, list) else reply


def read(
    groups: Sequence[Group],
    members: Sequence[list[int]],
    alone: Sequence[tuple[Lease, Call]],
    replies: Sequence[Any],
    answer: Callable[[Any, Lease], Any],
) -> tuple[list[Any], list[int]]:
    """The replies of the settle calls (``members``), then of the ``alone`` calls, read
    in order: per group, then per ``alone`` call, what ``answer`` makes of its row or
    reply; and the groups of the calls refused as a whole (INVALID), which wrote nothing
    and are to be sent again one by one."""
    answers: list[Any] = [None] * (len(groups) + len(alone))
    refused_whole: list[int] = []
    for call_index, reply in enumerate(replies):
        if call_index < len(members):
            chunk = members[call_index]
            if not isinstance(reply, list) and len(chunk) > 1:
                refused_whole += chunk  # one group's fault: each is sent again alone
                continue
            rows = reply if isinstance(reply, list) else [reply]
            for i, row in zip(chunk, rows, strict=True):
                answers[i] = answer(row, groups[i][1])
        else:
            lease = alone[call_index - len(members)][0]
            answers[len(groups) + call_index - len(members)] = answer(reply, lease)
    return answers, refused_whole


def answers_of(count: int, batch: Batch, replies: Sequence[Any]) -> list[Answer]:
    """Per request of ``batch`` (``count`` of them), its answer from ``replies`` (the
    answers to its groups, then to its ``alone`` calls) or its refusal."""
    settled: list[Answer] = [None] * count
    for index, invalid in batch.refused.items():
        settled[index] = invalid
    for index, reply in zip(batch.grouped + batch.alone_index, replies, strict=True):
        settled[index] = answer_of(reply)
    return settled


def answer_of(reply: Any) -> Answer:
    """A settle answer: the CommitReply, the FailReply or the LeaseError; None for the rest."""
    if isinstance(reply, CommitReply | FailReply | LeaseError):
        return reply
    return None


def extended(lease: Lease, reply: Any) -> Lease:
    """The lease with the expiry a renew reply gave it."""
    return replace(lease, expires_at_ms=reply.expires_at_ms)


def renewed(leases: Sequence[Lease], answers: Sequence[Any]) -> list[Lease | None]:
    """Per lease, the renewed lease from its answer, or None where it was lost; raises any
    other LeaseError."""
    kept: list[Lease | None] = []
    for lease, reply in zip(leases, answers, strict=False):
        if isinstance(reply, LeaseError):
            if not isinstance(reply, (LeaseLost, NotFound)):
                raise reply
            kept.append(None)
        else:
            kept.append(extended(lease, reply))
    return kept
