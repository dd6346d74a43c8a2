"""Checks a recorded history, the provider's log and the final state against the promise.

The evidence (:class:`~tests.faults.evidence.Evidence`, gathered by
:func:`~tests.faults.evidence.collect`) is: every
operation the processes recorded (:mod:`tests.faults.recorder`), the items the
planner made, the final record of each, the run's state and deadline, the
``<item>|<token>`` marks that commits left through a guarded write, and how
often the provider applied each idempotency key. :func:`check` asserts, in the
words of DESIGN.md section 1:

- ``duplicate-grant``: no (item, token) is granted twice;
- ``token-order``: per item, granted tokens strictly increase with server time;
- ``double-commit``: at most one accepted commit (one token) per item;
- ``stale-write``: no accepted write (commit, renew, fail report, effect record)
  carries a token lower than one granted before it, or a token never granted; no
  mark comes from a commit that was not the accepted one; an accepted commit left
  its mark;
- ``expired-write``: no write is accepted at or after its lease's expiry (the
  grant's, or the latest accepted renewal's: a renew, or an effect's intent recorded
  with a TTL; unknown when a renewal's reply was lost, and then not checked);
- ``unfinished``: the run is final and every planned item is done or dead, none
  pending, leased or ``vanished`` (no record at all);
- ``duplicate-effect`` / ``missing-effect``: each idempotency key applied at most
  once; each done item's effects applied exactly once;
- ``dishonest-success``: a run ends ``succeeded`` only if every planned item was
  done before its deadline.

An ``info`` operation may have happened or not: a claim without a reply only
leaves a gap in the tokens; a commit without a reply counts as accepted when the
final record holds its token, and as not having happened otherwise.

``loss=(from_ms, to_ms)`` says the server may have forgotten the writes it made
in that window of server time (an ``everysec`` crash: the last second before the
kill up to the restart; a restart without data: everything before it);
``may_lose=True`` alone means any write may have been lost (an evicting memory
policy). Then a token granted in the window may be granted again, a commit
accepted in it may be redone, a mark may be missing and an item may vanish; the
grants after the window are checked against those before it, and the run must
still not end ``succeeded`` without every planned item done.
Each breach carries the minimal slice of history that shows it.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from redis_lease.fleet.effects.ledger import idempotency_key
from redis_lease.fleet.runs.lifecycle import FINAL_STATES
from tests.faults.evidence import Evidence
from tests.faults.recorder import FAIL, INFO, OK, Op

#: The kinds of violation :func:`check` reports.
KINDS = (
    "duplicate-grant",
    "token-order",
    "double-commit",
    "stale-write",
    "expired-write",
    "unfinished",
    "vanished",
    "duplicate-effect",
    "missing-effect",
    "dishonest-success",
)
#: A window of server time (ms) whose writes the server may have forgotten, or None.
Window = tuple[int, int] | None
#: Accepted writes other than commits whose replies carry the server time.
_TIMED_WRITES = ("renew", "fail", "record_effect")


@dataclass(frozen=True)
class Breach:
    """One breach: its kind, what it is about, and the operations that show it."""

    kind: str
    item: str
    message: str
    ops: tuple[Op, ...] = ()

    def render(self) -> str:
        """The message with its slice of history, one operation per line."""
        lines = [f"[{self.kind}] {self.item}: {self.message}"]
        lines.extend("    " + describe(op) for op in self.ops)
        return "\n".join(lines)


class Violation(AssertionError):
    """The history breaks the promise; ``violations`` lists each breach with its slice."""

    def __init__(self, violations: list[Breach]) -> None:
        shown = "\n".join(v.render() for v in violations[:12])
        more = f"\n... and {len(violations) - 12} more" if len(violations) > 12 else ""
        super().__init__(f"{len(violations)} violation(s) of the promise:\n{shown}{more}")
        self.violations = violations

    @property
    def kinds(self) -> set[str]:
        """The kinds of violation found."""
        return {v.kind for v in self.violations}


@dataclass
class Summary:
    """What a checked history held."""

    operations: Counter[str] = field(default_factory=Counter)
    grants: int = 0
    takeovers: int = 0
    accepted_commits: int = 0
    refused_commits: int = 0
    #: Calls of any kind the fence refused (``LEASE_LOST``).
    stale_refused: int = 0
    unknown_outcomes: int = 0
    done: int = 0
    dead: int = 0
    effects_applied: int = 0
    #: Tokens granted again after the server forgot them (only with a loss window).
    regranted_after_loss: int = 0
    #: Items redone after the server forgot their commit (only with a loss window).
    recommitted_after_loss: int = 0
    #: The highest token granted per item, and how many grants each item had.
    max_token: dict[str, int] = field(default_factory=dict)
    grants_per_item: Counter[str] = field(default_factory=Counter)


def describe(op: Op) -> str:
    """One line for an operation: process, number, outcome, call, item, token, clocks."""
    parts = [f"{op.process}#{op.op}", op.type, op.get("f", "?")]
    for name in ("item", "token", "lease", "server_ms", "repeated", "state", "key"):
        value = op.get(name)
        if value not in (None, ""):
            parts.append(f"{name}={value}")
    grants = op.get("grants") or []
    if grants:
        parts.append("grants=" + ",".join(f"{g['item']}@{g['token']}" for g in grants[:8]))
    if op.get("error"):
        parts.append(f"error={str(op.get('error'))[:120]}")
    parts.append(f"wall={op.invoked_wall_ms}")
    return " ".join(str(p) for p in parts)


@dataclass(frozen=True)
class _Grant:
    item: str
    token: int
    server_ms: int
    op: Op
    takeover: bool = False


@dataclass(frozen=True)
class _Write:
    item: str
    token: int
    server_ms: int | None
    op: Op


def _grants(ops: Iterable[Op]) -> dict[str, list[_Grant]]:
    by_item: dict[str, list[_Grant]] = defaultdict(list)
    for op in ops:
        if op.type == OK and op.get("f") in ("claim", "claim_next"):
            for grant in op.get("grants") or []:
                by_item[grant["item"]].append(
                    _Grant(
                        grant["item"],
                        int(grant["token"]),
                        int(grant["server_ms"]),
                        op,
                        bool(grant.get("takeover")),
                    )
                )
    for grants in by_item.values():
        grants.sort(key=lambda g: (g.server_ms, g.token))
    return by_item


def _write_time(op: Op) -> int | None:
    if op.get("f") == "record_effect":
        try:
            record = json.loads(op.get("record") or "{}")
        except json.JSONDecodeError:
            return None
        if int(record.get("token", -1)) != op.get("token"):
            return None  # an applied record returned unchanged: nothing was written now
        return int(record["updated_at"]) if "updated_at" in record else None
    server_ms = op.get("server_ms")
    return int(server_ms) if server_ms is not None else None


def _accepted_writes(ops: Iterable[Op]) -> dict[str, list[_Write]]:
    by_item: dict[str, list[_Write]] = defaultdict(list)
    for op in ops:
        if op.type == OK and op.get("f") in ("commit", *_TIMED_WRITES):
            token = op.get("token")
            if isinstance(token, int) and op.get("item"):
                by_item[op.get("item")].append(_Write(op.get("item"), token, _write_time(op), op))
    return by_item


def _stale(op: Op) -> bool:
    """True for a call the fence refused (``LEASE_LOST``)."""
    return op.type == FAIL and str(op.get("error", "")).startswith("LEASE_LOST")


def _lost(server_ms: int | None, loss: Window) -> bool:
    """True when the server may have forgotten what it did at ``server_ms``."""
    return loss is not None and server_ms is not None and loss[0] <= server_ms < loss[1]


def _check_grants(grants: dict[str, list[_Grant]], loss: Window, summary: Summary) -> list[Breach]:
    found = []
    for item, granted in grants.items():
        first_of: dict[int, _Grant] = {}
        highest: _Grant | None = None
        restarted = False
        forgotten = 0  # the highest token granted in the window, once the server is back
        for grant in granted:
            if loss is not None and not restarted and grant.server_ms >= loss[1]:
                # the server came back: it remembers only what it granted before the window
                restarted = True
                kept = [g for g in granted if g.server_ms < loss[0]]
                first_of = {g.token: g for g in reversed(kept)}
                highest = max(kept, key=lambda g: g.token, default=None)
                forgotten = max((g.token for g in granted if _lost(g.server_ms, loss)), default=0)
            if restarted and grant.token <= forgotten:
                summary.regranted_after_loss += 1
            summary.grants += 1
            summary.grants_per_item[item] += 1
            summary.max_token[item] = max(summary.max_token.get(item, 0), grant.token)
            summary.takeovers += grant.takeover
            earlier = first_of.get(grant.token)
            if earlier is not None and earlier.op is not grant.op:
                if _lost(earlier.server_ms, loss):
                    summary.regranted_after_loss += 1
                else:
                    found.append(
                        Breach(
                            "duplicate-grant",
                            item,
                            f"token {grant.token} granted twice",
                            (earlier.op, grant.op),
                        )
                    )
            elif highest is not None and grant.token <= highest.token:
                if _lost(highest.server_ms, loss):
                    summary.regranted_after_loss += 1
                else:
                    found.append(
                        Breach(
                            "token-order",
                            item,
                            f"token {grant.token} granted at {grant.server_ms} ms after token "
                            f"{highest.token} at {highest.server_ms} ms: tokens went back",
                            (highest.op, grant.op),
                        )
                    )
            first_of.setdefault(grant.token, grant)
            if highest is None or grant.token > highest.token:
                highest = grant
    return found


def _check_writes(
    evidence: Evidence,
    grants: dict[str, list[_Grant]],
    writes: dict[str, list[_Write]],
    loss: Window,
    summary: Summary,
) -> tuple[list[Breach], dict[str, int]]:
    """Stale writes and double commits; returns the accepted commit token per item."""
    found: list[Breach] = []
    accepted: dict[str, int] = {}
    commit_ops: dict[str, list[Op]] = defaultdict(list)
    for op in evidence.ops:
        if op.get("f") == "commit" and op.get("item"):
            commit_ops[op.get("item")].append(op)
    for item in set(writes) | set(commit_ops) | set(evidence.records):
        for write in writes.get(item, []):
            newer = next(
                (
                    g
                    for g in grants.get(item, [])
                    if g.token > write.token
                    and write.server_ms is not None
                    and g.server_ms <= write.server_ms
                    and not _lost(g.server_ms, loss)
                ),
                None,
            )
            if newer is not None:
                found.append(
                    Breach(
                        "stale-write",
                        item,
                        f"{write.op.get('f')} from token {write.token} accepted at "
                        f"{write.server_ms} ms after token {newer.token} was granted at "
                        f"{newer.server_ms} ms",
                        (newer.op, write.op),
                    )
                )
        ok_commits = [op for op in commit_ops.get(item, []) if op.type == OK]
        summary.accepted_commits += sum(not op.get("repeated") for op in ok_commits)
        summary.refused_commits += sum(_stale(op) for op in commit_ops.get(item, []))
        tokens: dict[int, Op | None] = {int(op.get("token")): op for op in ok_commits}
        record = evidence.records.get(item)
        if record is not None and record.state == "done":
            # the final record proves its commit happened, replied to or not
            happened = next(
                (op for op in commit_ops.get(item, []) if op.get("token") == record.token), None
            )
            tokens.setdefault(record.token, happened)
        # the accepted commit is the one the final record holds (else the highest)
        final_token = (
            record.token
            if record is not None and record.state == "done"
            else max(tokens, default=0)
        )
        if len(tokens) > 1:
            ordered = sorted(tokens.items())
            others = [op for token, op in ordered if token != final_token]
            if all(op is not None and _lost(op.get("server_ms"), loss) for op in others):
                summary.recommitted_after_loss += len(others)  # the server forgot them
            else:
                found.append(
                    Breach(
                        "double-commit",
                        item,
                        f"commits accepted from tokens {sorted(tokens)}",
                        tuple(op for _, op in ordered if op is not None),
                    )
                )
        if tokens:
            accepted[item] = final_token
        # a token granted after the accepted one means a done item was claimed again
        # or the accepted commit was stale
        final = accepted.get(item)
        if final is not None:
            for grant in grants.get(item, []):
                if grant.token > final and not _lost(grant.server_ms, loss):
                    commit = tokens.get(final)
                    found.append(
                        Breach(
                            "stale-write",
                            item,
                            f"token {grant.token} was granted, yet the commit of token {final} "
                            "was accepted",
                            tuple(op for op in (grant.op, commit) if op is not None),
                        )
                    )
                    break
    return found, accepted


def _check_marks(evidence: Evidence, accepted: dict[str, int], loss: Window) -> list[Breach]:
    found: list[Breach] = []
    if evidence.marks is None:
        return found
    for item, tokens in evidence.marks.items():
        final = accepted.get(item)
        for token in sorted(tokens):
            if token != final:
                refused = tuple(
                    op
                    for op in evidence.ops
                    if op.get("f") == "commit"
                    and op.get("item") == item
                    and op.get("token") == token
                )
                found.append(
                    Breach(
                        "stale-write",
                        item,
                        f"a guarded write of token {token} was applied, but the accepted commit "
                        f"is {'token ' + str(final) if final is not None else 'none'}",
                        refused,
                    )
                )
    for item, token in accepted.items():
        record = evidence.records.get(item)
        if (
            record is not None
            and record.state == "done"
            and token not in evidence.marks.get(item, set())
        ):
            commits = tuple(
                op for op in evidence.ops if op.get("f") == "commit" and op.get("item") == item
            )
            if loss is None:  # a lost write may take the mark with it (eviction)
                found.append(
                    Breach(
                        "stale-write",
                        item,
                        f"the commit of token {token} was accepted without its guarded write",
                        commits,
                    )
                )
    return found


def _check_expiry(
    ops: list[Op], grants: dict[str, list[_Grant]], writes: dict[str, list[_Write]]
) -> list[Breach]:
    """Accepted writes at or after their lease's expiry, and from tokens never granted."""
    found: list[Breach] = []
    expiry: dict[tuple[str, int], list[tuple[int, int, Op]]] = defaultdict(list)
    unknown_renewals = set()
    # a claim without a reply may have granted a token nobody saw: its item (claim) or
    # any item of its shard (claim_next) may then write under an unseen token
    unseen_items = {op.get("item") for op in ops if op.type == INFO and op.get("f") == "claim"}
    unseen_shards = {
        (op.get("prefix"), op.get("shard"))
        for op in ops
        if op.type == INFO and op.get("f") == "claim_next"
    }
    for item, granted in grants.items():
        for grant in granted:
            spec = next(g for g in grant.op.get("grants") if g["item"] == item)
            expiry[(item, grant.token)].append((grant.server_ms, int(spec["expires_ms"]), grant.op))
    for op in ops:
        if op.get("f") == "renew" and isinstance(op.get("token"), int):
            key = (op.get("item"), op.get("token"))
            if op.type == OK:
                expiry[key].append((int(op.get("server_ms")), int(op.get("expires_ms")), op))
            elif op.type == INFO:
                unknown_renewals.add(key)
        elif op.get("f") == "record_effect" and isinstance(op.get("token"), int):
            key = (op.get("item"), op.get("token"))
            at = _write_time(op)
            if op.type == OK and op.get("expires_ms") and at is not None:
                expiry[key].append((at, int(op.get("expires_ms")), op))  # renewed by the intent
            elif op.type == INFO:
                unknown_renewals.add(key)  # it may have renewed the lease
    for item, accepted in writes.items():
        for write in accepted:
            key = (item, write.token)
            if write.op.get("repeated") or write.server_ms is None or key in unknown_renewals:
                continue
            known = [
                (at, until, op)
                for at, until, op in expiry.get(key, [])
                if at <= write.server_ms and op is not write.op  # a renewal's own expiry is new
            ]
            if not known:
                shard = (write.op.get("prefix"), write.op.get("shard"))
                if item not in unseen_items and shard not in unseen_shards:
                    found.append(
                        Breach(
                            "stale-write",
                            item,
                            f"{write.op.get('f')} accepted from token {write.token}, never granted",
                            (write.op,),
                        )
                    )
                continue
            _, until, source = max(known, key=lambda entry: entry[1])
            if write.server_ms >= until:
                found.append(
                    Breach(
                        "expired-write",
                        item,
                        f"{write.op.get('f')} of token {write.token} accepted at "
                        f"{write.server_ms} ms; its lease expired at {until} ms",
                        (source, write.op),
                    )
                )
    return found


def _check_outcome(
    evidence: Evidence, accepted: dict[str, int], loss: Window, summary: Summary
) -> list[Breach]:
    found = []
    if evidence.run_state is not None and evidence.run_state not in FINAL_STATES:
        found.append(
            Breach(
                "unfinished",
                evidence.run_id,
                f"the run is {evidence.run_state or 'gone'}, not final",
            )
        )
    late_or_missing = []
    for item in evidence.planned:
        record = evidence.records.get(item)
        if record is None:
            late_or_missing.append(item)
            if loss is None:
                found.append(Breach("vanished", item, "planned, but it has no record"))
            continue
        summary.done += record.state == "done"
        summary.dead += record.state == "dead"
        if record.state not in ("done", "dead"):
            found.append(Breach("unfinished", item, f"ends {record.state} (token {record.token})"))
        if record.state != "done" or (
            evidence.deadline_ms and (record.done_at_ms or 0) >= evidence.deadline_ms
        ):
            late_or_missing.append(item)
    if evidence.run_state == "succeeded" and late_or_missing:
        found.append(
            Breach(
                "dishonest-success",
                evidence.run_id,
                f"the run succeeded, but {len(late_or_missing)} planned item(s) were not done "
                f"before its deadline: {late_or_missing[:5]}",
            )
        )
    return found


def _check_effects(evidence: Evidence, summary: Summary) -> list[Breach]:
    found = []
    effect_ops: dict[str, list[Op]] = defaultdict(list)
    for op in evidence.ops:
        if op.get("f") == "record_effect" and op.get("key"):
            effect_ops[op.get("key")].append(op)
    own = f"{evidence.run_id}|"  # keys of other runs are theirs to check
    for key, times in evidence.applied.items():
        if not key.startswith(own):
            continue
        summary.effects_applied += times
        if times > 1:
            found.append(
                Breach(
                    "duplicate-effect",
                    key,
                    f"the provider applied it {times} times",
                    tuple(effect_ops.get(key, [])),
                )
            )
    for item in evidence.planned:
        record = evidence.records.get(item)
        if record is None or record.state != "done":
            continue
        for name in evidence.effects:
            key = idempotency_key(evidence.run_id, item, name)
            if evidence.applied.get(key, 0) == 0:
                found.append(
                    Breach(
                        "missing-effect",
                        item,
                        f"done, but its effect {key!r} was never applied",
                        tuple(effect_ops.get(key, [])),
                    )
                )
    return found


def check_grants(ops: Sequence[Op], *, loss: Window = None) -> Summary:
    """Only the grant rules (``duplicate-grant``, ``token-order``), for a history of claims."""
    summary = Summary()
    violations = _check_grants(_grants(ops), loss, summary)
    if violations:
        raise Violation(violations)
    return summary


def check(evidence: Evidence, *, loss: Window = None, may_lose: bool = False) -> Summary:
    """Checks the evidence; returns what it held, or raises :class:`Violation`.

    ``loss``: the window of server time whose writes may be forgotten;
    ``may_lose`` without a window: any write may have been (an evicting policy).
    """
    if may_lose and loss is None:
        loss = (0, 2**63)
    summary = Summary()
    ops = [
        op
        for op in evidence.ops
        if op.get("run") in (None, evidence.run_id)
        and (evidence.prefix is None or op.get("prefix") in (None, evidence.prefix))
    ]
    run_evidence = Evidence(**{**evidence.__dict__, "ops": ops})
    for op in ops:
        summary.operations[f"{op.get('f')}:{op.type}"] += 1
        summary.unknown_outcomes += op.type == INFO
        summary.stale_refused += _stale(op)
    grants = _grants(ops)
    violations = _check_grants(grants, loss, summary)
    writes = _accepted_writes(ops)
    found, accepted = _check_writes(run_evidence, grants, writes, loss, summary)
    violations += found
    if loss is None:  # a forgotten grant or renewal leaves the expiry unknown
        violations += _check_expiry(ops, grants, writes)
    violations += _check_marks(run_evidence, accepted, loss)
    violations += _check_outcome(run_evidence, accepted, loss, summary)
    violations += _check_effects(run_evidence, summary)
    if violations:
        raise Violation(violations)
    return summary
