"""Records every script call of a process as a history of operations (JSON lines).

An operation is logged when it is sent (``invoke``) and when it ends: ``ok``
(the script's reply), ``fail`` (an error reply: the script refused, and its only
writes are refusal counters; a call the client sent again after a reset may
also end so when its first send had landed) or ``info`` (no reply: a reset or a
timeout, so it may or may not have run). A process killed between ``invoke``
and its end leaves the operation open, which the checker reads as ``info``.
A ``settle`` call (many items of a shard) is logged as one operation per item, named
by the item's own operation (commit, fail, release, renew) and ended with the item's own
reply row, so the checker sees per-item histories. A call sent again after NOSCRIPT is
one operation (it did not run). Each line carries the process, the key prefix, run,
shard, item, token and lease id the call names, the worker's clock (``wall_ms``) and, when the reply
has one, the server's clock (``server_ms``).

A process installs a recorder with :func:`install` (the fault job does it at
import in every worker process; a test or a benchmark does it for itself). Lines are
written with one ``write`` on an ``O_APPEND`` descriptor, so a SIGKILL loses at
most the operation in flight and never garbles a line.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from redis_lease.protocol import scripts
from redis_lease.protocol.leases import CommitReply, FailReply
from redis_lease.protocol.replies import EffectRecorded, Grant, Released, Renewed

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
#: Scripts that take an item, a token and a lease id as ARGV[1..3].
HOLDER_CALLS = ("renew", "commit", "fail", "release", "record_effect")
_TAG = re.compile(r"\{(.*)#(\d+)\}")
#: Arguments per item of a settle call (operation, item, token, lease id, detail, option,
#: trace id).
SETTLE_GROUP = 7


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _grant(grant: Grant) -> dict[str, Any]:
    return {
        "item": grant.item_id,
        "token": grant.token,
        "lease": grant.lease_id,
        "expires_ms": grant.expires_at_ms,
        "attempt": grant.attempt,
        "takeover": grant.takeover,
        "server_ms": grant.now_ms,
    }


def describe_call(name: str, keys: Sequence[str], args: Sequence[Any]) -> dict[str, Any]:
    """What an invoke line says about a call: its script, run, shard, item, token, lease."""
    fields: dict[str, Any] = {"f": name}
    found = _TAG.search(keys[0]) if keys else None
    if found:
        fields["run"], fields["shard"] = found.group(1), int(found.group(2))
        fields["prefix"] = keys[0][: found.start()].rstrip(":")
    if name == "claim" and args:
        fields["item"] = _text(args[0])
        fields["lease"] = _text(args[2]) if len(args) > 2 else ""
    elif name in HOLDER_CALLS and len(args) >= 3:
        fields["item"] = _text(args[0])
        token = _text(args[1])
        fields["token"] = int(token) if token.isdigit() else token
        fields["lease"] = _text(args[2])
    if name == "commit" and len(args) >= 6:
        fields["writes"] = _text(args[5])[:2000]
        fields["guarded"] = [_text(k) for k in keys[7:]]
    if name == "record_effect" and len(args) >= 6:
        fields["key"], fields["state"] = _text(args[3]), _text(args[5])
    if name == "claim_next" and len(args) >= 2:
        fields["lease"] = _text(args[1])
    return fields


def describe_reply(reply: Any) -> dict[str, Any]:
    """What an ok line says about a decoded reply (server time, grants, outcome)."""
    if isinstance(reply, Grant):
        return {"grants": [_grant(reply)], "server_ms": reply.now_ms}
    if isinstance(reply, list) and all(isinstance(g, Grant) for g in reply):
        now = max((g.now_ms for g in reply), default=None)
        return {"grants": [_grant(g) for g in reply], "server_ms": now}
    if isinstance(reply, CommitReply):
        return {"repeated": reply.repeated, "token": reply.token, "server_ms": reply.done_at_ms}
    if isinstance(reply, Released):
        return {"server_ms": reply.now_ms}
    if isinstance(reply, Renewed):
        return {"expires_ms": reply.expires_at_ms, "server_ms": reply.now_ms}
    if isinstance(reply, FailReply):
        return {"state": reply.state, "server_ms": reply.now_ms}
    if isinstance(reply, EffectRecorded):
        renewed = {"expires_ms": reply.expires_at_ms} if reply.expires_at_ms else {}
        return {"previous": reply.previous, "record": reply.record[:2000], **renewed}
    if isinstance(reply, tuple) and hasattr(reply, "_asdict"):
        return {"reply": {k: v for k, v in reply._asdict().items() if not isinstance(v, dict)}}
    if isinstance(reply, (int, bool, str)) or reply is None:
        return {"reply": reply}
    return {"reply": repr(reply)[:200]}


class Recorder:
    """An observer of script calls that appends each operation to a JSON-lines file."""

    def __init__(self, path: Path, process: str) -> None:
        self.path = path
        self.process = process
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def _write(self, fields: dict[str, Any]) -> None:
        line = json.dumps(fields, separators=(",", ":"), default=str) + "\n"
        with self._lock:
            os.write(self._fd, line.encode())

    def sent(self, name: str, keys: Sequence[str], args: Sequence[Any]) -> tuple[bool, list[int]]:
        """Logs the invoke; the ticket is the operations' numbers in this process: one, or
        one per item of a batch (``settle``: each item's operation is its own)."""
        calls = [(name, args)]
        if name == "settle":
            calls = [
                (_text(args[i]), [args[i + 1], args[i + 2], args[i + 3], args[i + 4], args[i + 5]])
                for i in range(0, len(args) - len(args) % SETTLE_GROUP, SETTLE_GROUP)
            ]
        ops = []
        for op_name, op_args in calls:
            op = next(self._ids)
            fields = {"process": self.process, "op": op, "type": INVOKE}
            fields.update(describe_call(op_name, keys, op_args))
            self._write({**fields, "wall_ms": int(time.time() * 1000)})
            ops.append(op)
        return name == "settle", ops

    def answered(self, ticket: tuple[bool, list[int]], reply: Any) -> None:
        """Logs ``ok`` with the reply, or ``fail`` with the error reply (per item of a batch:
        its own row, or the error that refused the whole call)."""
        batch, ops = ticket
        rows = reply if batch and isinstance(reply, list) else [reply] * len(ops)
        for op, row in zip(ops, rows, strict=True):
            base = {"process": self.process, "op": op, "wall_ms": int(time.time() * 1000)}
            if isinstance(row, redis.ResponseError):
                self._write({**base, "type": FAIL, "error": str(row)[:500]})
            else:
                self._write({**base, "type": OK, **describe_reply(row)})

    def unanswered(self, ticket: tuple[bool, list[int]], error: BaseException) -> None:
        """Logs ``info``: the call may or may not have run."""
        detail = f"{type(error).__name__}: {error}"[:500]
        for op in ticket[1]:
            base = {"process": self.process, "op": op, "wall_ms": int(time.time() * 1000)}
            self._write({**base, "type": INFO, "error": detail})

    def close(self) -> None:
        """Closes the file."""
        os.close(self._fd)


def install(directory: Path | str, label: str = "") -> Callable[[], None]:
    """Records this process's script calls into ``directory``; returns the removal."""
    process = f"{label or 'p'}:{socket.gethostname()}:{os.getpid()}"
    path = Path(directory) / f"{label or 'p'}-{os.getpid()}.jsonl"
    recorder = Recorder(path, process)
    remove = scripts.observe(recorder)

    def uninstall() -> None:
        remove()
        recorder.close()

    return uninstall


@dataclass(frozen=True)
class Op:
    """One operation: its invoke line merged with its end line (``type`` is the end)."""

    process: str
    op: int
    type: str
    fields: dict[str, Any]
    invoked_wall_ms: int
    ended_wall_ms: int | None

    def get(self, name: str, default: Any = None) -> Any:
        """A field of the invoke or end line (the end line wins)."""
        return self.fields.get(name, default)


def read_lines(directory: Path) -> Iterator[dict[str, Any]]:
    """Every line of every history file in ``directory`` (a torn last line is skipped)."""
    for path in sorted(Path(directory).glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # a process killed mid-write; only possible for the last line


def read_ops(lines: Iterator[dict[str, Any]] | list[dict[str, Any]]) -> list[Op]:
    """Pairs invoke and end lines per process; an operation never ended is ``info``."""
    invoked: dict[tuple[str, int], dict[str, Any]] = {}
    ended: dict[tuple[str, int], dict[str, Any]] = {}
    order: list[tuple[str, int]] = []
    for line in lines:
        key = (line["process"], int(line["op"]))
        if line["type"] == INVOKE:
            invoked[key] = line
            order.append(key)
        else:
            ended[key] = line
    ops = []
    for key in order:
        start = invoked[key]
        end = ended.get(key, {"type": INFO, "error": "no reply recorded (process ended)"})
        fields = {**start, **end}
        for name in ("process", "op", "type", "wall_ms"):
            fields.pop(name, None)
        ops.append(
            Op(key[0], key[1], end["type"], fields, int(start["wall_ms"]), end.get("wall_ms"))
        )
    return ops
