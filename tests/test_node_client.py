"""The Node.js client (clients/node/) on the same Lua scripts: one protocol, two languages.

The expanded scripts are byte-for-byte the same in both (equal SHA1s); the fencing story
holds across languages in both directions; and a run worked at once by a Python worker
process and a Node worker process, each paused past its leases once so that the other
takes them over, ends with every item done exactly once, the merged histories passing
tests/faults/checker.py. Needs node and npm (clients/node/setup.sh installs ioredis):
under ``CI=true`` their absence fails these tests, elsewhere it skips them.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import multiprocessing
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from redis_lease import Item, LeaseLost, LeaseStore
from redis_lease.fleet.jobs.job import Job
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.worker.lease_keeper import LeaseKeeper
from redis_lease.fleet.worker.shard_loop import work_shard
from redis_lease.limits import lua_dir
from redis_lease.protocol.leases import ItemRecord
from redis_lease.protocol.scripts import source
from tests.faults import recorder
from tests.faults.checker import check
from tests.faults.evidence import collect
from tests.faults.recorder import FAIL, OK, Op
from tests.fleet_helpers import threads_stopped, wait_for
from tests.helpers import wait_past

pytestmark = pytest.mark.slow

NODE_DIR = Path(__file__).resolve().parent.parent / "clients" / "node"
RUN = "mixed:2026-12-04"
ITEM = "acct_42:cursor_9"
SHORT = 0.05  # seconds: a lease meant to expire during the test
ITEMS = 400
SHARDS = 4
TTL_MS = 1000  # both workers' leases in the mixed run
HANDLE_MS = 15  # each worker's time per item


@pytest.fixture(scope="module")
def node() -> str:
    """The node executable, with the client's dependencies installed by its setup step."""
    found = shutil.which("node")
    if found is None or shutil.which("npm") is None:
        message = "node and npm are needed for the Node client: apt-get install nodejs npm"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    setup = subprocess.run(
        [str(NODE_DIR / "setup.sh")], capture_output=True, text=True, timeout=300
    )
    assert setup.returncode == 0, f"clients/node/setup.sh failed:\n{setup.stderr}"
    return found


class NodeOps:
    """A Node process running clients/node/ops.js: one JSON request line, one answer line.

    A reader thread hands its output lines over, so every answer is awaited with a deadline.
    """

    ANSWER_TIMEOUT = 30.0

    def __init__(self, node: str, url: str, prefix: str) -> None:
        self.proc = subprocess.Popen(
            [node, str(NODE_DIR / "ops.js"), url, prefix],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")  # the end of its output

    def ask(self, **request: Any) -> dict[str, Any]:
        """Sends one request; returns its answer, ``{"ok": ...}`` or ``{"error": ...}``."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.lines.get(timeout=self.ANSWER_TIMEOUT)
        except queue.Empty:
            raise AssertionError(f"ops.js gave no answer to {request} within 30 s") from None
        assert line, f"ops.js ended (exit {self.proc.poll()})"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def ok(self, **request: Any) -> Any:
        """The ``ok`` part of the answer; fails the test on an error answer."""
        answer = self.ask(**request)
        assert "ok" in answer, f"{request['op']} answered {answer}"
        return answer["ok"]

    def refused(self, **request: Any) -> dict[str, Any]:
        """The ``error`` part of the answer; fails the test when the request succeeded."""
        answer = self.ask(**request)
        assert "error" in answer, f"{request['op']} was accepted: {answer}"
        error: dict[str, Any] = answer["error"]
        return error

    def close(self) -> None:
        """Ends the process (end of input); killed when it has not ended within 10 s."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)
            self.reader.join(timeout=10)  # its output ended with the process
            assert self.proc.stdout is not None
            self.proc.stdout.close()


@pytest.fixture
def node_ops(node: str, redis_url: str, real_store: LeaseStore) -> Iterator[NodeOps]:
    """A Node client on the test's Redis, under the test's prefix."""
    ops = NodeOps(node, redis_url, real_store.prefix)
    yield ops
    ops.close()


def test_an_unanswered_call_is_not_resent_after_a_reconnect(node: str) -> None:
    # ioredis resends unanswered commands after a reconnect unless told not to: a commit
    # could run twice. The client's connection must have that off.
    program = (
        "import {connect} from './index.js';"
        "const c = connect('redis://127.0.0.1:1/0');"
        "const o = c.redis.options;"
        "console.log(JSON.stringify([o.autoResendUnfulfilledCommands, o.maxRetriesPerRequest]));"
        "c.redis.disconnect();"
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", program],
        cwd=NODE_DIR,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    resend, retries = json.loads(done.stdout)
    assert resend is False and isinstance(retries, int) and 0 < retries <= 3


def test_every_expanded_script_has_the_same_sha1_in_both_languages(
    node_ops: NodeOps, real_store: LeaseStore
) -> None:
    names = sorted(path.stem for path in lua_dir().glob("*.lua"))
    node_shas = node_ops.ok(op="scripts")
    assert sorted(node_shas) == names
    for name in names:
        expected = hashlib.sha1(source(name).encode()).hexdigest()
        assert node_shas[name] == expected, f"{name}.lua expands differently in Node"
        assert real_store.client.script_load(source(name)) == expected


def test_node_takes_over_and_the_stale_python_holder_is_refused(
    node_ops: NodeOps, real_store: LeaseStore
) -> None:
    store = real_store
    store.add(RUN, [Item(ITEM, {"version": 3})], shards=4)
    a = store.claim(RUN, ITEM, worker="py", ttl=SHORT)
    wait_past(store.client, a.expires_at_ms)

    b = node_ops.ok(op="claim", run=RUN, item=ITEM, ttlMs=60_000, worker="node")
    assert (b["token"], b["takeover"], b["attempt"]) == (a.token + 1, True, 2)
    assert (b["shard"], b["payload"]) == (a.shard, {"version": 3})
    for stale in (lambda: store.commit(a, {"by": "py"}), lambda: store.renew(a, ttl=60)):
        with pytest.raises(LeaseLost) as info:
            stale()
        assert (info.value.current_token, info.value.reason) == (b["token"], "token")
    assert store.item(RUN, ITEM).state == "leased"

    renewed = node_ops.ok(op="renew", lease=b, ttlMs=120_000)
    assert renewed["expiresAtMs"] > b["expiresAtMs"]
    done = node_ops.ok(op="commit", lease=renewed, result={"by": "node"})
    assert (done["repeated"], done["token"]) == (False, b["token"])
    again = node_ops.ok(op="commit", lease=renewed, result={"by": "node, again"})
    assert (again["repeated"], json.loads(again["result"])) == (True, {"by": "node"})
    record = store.item(RUN, ITEM)
    assert (record.state, record.token, record.result) == ("done", b["token"], {"by": "node"})

    taken = node_ops.refused(op="claim", run=RUN, item=ITEM, worker="node")
    assert (taken["name"], taken["state"]) == ("NotClaimable", "done")


def test_python_takes_over_and_the_stale_node_holder_is_refused(
    node_ops: NodeOps, real_store: LeaseStore
) -> None:
    store = real_store
    store.add(RUN, [Item(ITEM, {"version": 3})], shards=4)
    a = node_ops.ok(op="claim", run=RUN, item=ITEM, ttlMs=50, worker="node")
    assert (a["token"], a["takeover"]) == (1, False)
    wait_past(store.client, a["expiresAtMs"])

    b = store.claim(RUN, ITEM, worker="py", ttl=60)
    assert (b.token, b.takeover, b.shard) == (a["token"] + 1, True, a["shard"])
    before = store.item(RUN, ITEM)
    for request in (
        {"op": "commit", "result": {"by": "node"}},
        {"op": "renew", "ttlMs": 60_000},
        {"op": "fail", "error": "node gave up"},
    ):
        error = node_ops.refused(lease=a, **request)
        assert (error["name"], error["code"]) == ("LeaseLost", "LEASE_LOST"), error
        assert (error["currentToken"], error["reason"], error["token"]) == (b.token, "token", 1)
    assert store.item(RUN, ITEM) == before

    outcome = store.commit(b, {"by": "py"})
    assert (outcome.token, outcome.repeated) == (b.token, False)
    assert store.item(RUN, ITEM).result == {"by": "py"}
    late = node_ops.refused(op="commit", lease=a, result={"by": "node"})
    assert (late["name"], late["state"], late["reason"]) == ("LeaseLost", "done", "state")


def test_node_errors_are_typed_from_the_script_replies(
    node_ops: NodeOps, real_store: LeaseStore
) -> None:
    real_store.add(RUN, [Item(ITEM)], shards=2)
    missing = node_ops.refused(op="claim", run=RUN, item="no_such_item", worker="node")
    assert (missing["name"], missing["code"]) == ("NotFound", "NOT_FOUND")
    bad = node_ops.refused(op="claim", run=RUN, item=ITEM, worker="node", ttlMs=0)
    assert (bad["name"], bad["code"]) == ("InvalidInput", "INVALID")
    assert "ARGV[4]" in bad["message"]
    unknown_run = node_ops.refused(op="claimNext", run="no:such-run", shard=0)
    assert unknown_run["name"] == "NotFound"
    outside = node_ops.refused(op="claimNext", run=RUN, shard=2)
    assert (outside["name"], outside["message"]) == (
        "InvalidInput",
        f"shard 2 out of range: run {RUN} has shards 0-1",
    )
    real_store.set_closed(RUN, True)
    closed = node_ops.refused(op="claimNext", run=RUN, shard=0, worker="node")
    assert (closed["name"], closed["reason"]) == ("RunClosed", "closed")


# -- one run, a Python worker and a Node worker -----------------------------------------------


def python_worker(url: str, prefix: str, out: str, go: Any) -> None:
    """A Python worker process: the shard loop over every shard until the run is finished.

    Its leases are kept renewed by a LeaseKeeper; its script calls are recorded into ``out``.
    """
    recorder.install(out, "py")
    store = LeaseStore.from_url(url, prefix=prefix)
    job = Job("mixed", lease_ttl_seconds=TTL_MS / 1000, batch_size=5, commit_interval_seconds=0.0)

    @job.handler
    def handle(item: Item, lease: Any) -> dict[str, Any]:
        time.sleep(HANDLE_MS / 1000)
        return {"worker": "py", "token": lease.token}

    keeper = LeaseKeeper(store, job.options.lease_ttl_seconds)
    keeper.start()
    go.wait(60)
    ends = time.monotonic() + 120
    while store.status(RUN).unfinished and time.monotonic() < ends:
        for shard in range(SHARDS):
            stop = threading.Event()
            work_shard(store, job, RUN, shard, worker="py", budget=30, stop=stop, keeper=keeper)
        time.sleep(0.01)  # the rest is leased by the Node worker: look again
    if store.status(RUN).unfinished:
        raise RuntimeError("the run was not finished within 120 s")


def held_by(store: LeaseStore, owner: str) -> list[ItemRecord]:
    """The items of the run leased by ``owner`` now."""
    return [
        record
        for shard in range(SHARDS)
        for record in store.items(RUN, shard)
        if record.state == "leased" and record.owner == owner
    ]


def taken_over(store: LeaseStore, held: list[ItemRecord]) -> bool:
    """True once a newer token holds one of the ``held`` items."""
    return any(store.item(RUN, r.item_id).token > r.token for r in held)


def pause_past_leases(store: LeaseStore, pid: int, owner: str) -> list[ItemRecord]:
    """Stops process ``pid`` while it holds leases, until every one of them has expired on the
    server clock and the other worker has taken one over; then lets it go on."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        os.kill(pid, signal.SIGSTOP)
        try:
            wait_for(functools.partial(threads_stopped, pid), 10, "the process to stop")
            held = held_by(store, owner)
            if held:
                wait_past(store.client, max(r.expires_at_ms or 0 for r in held))
                wait_for(
                    functools.partial(taken_over, store, held),
                    15,
                    f"a takeover of {owner}'s leases",
                )
                return held
        finally:
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.01)  # it held nothing at that moment: stop it again soon
    raise AssertionError(f"{owner} never held a lease")


def refusals(ops: list[Op], process: str) -> list[Op]:
    """The calls of a process that the fence refused (LEASE_LOST)."""
    return [
        op
        for op in ops
        if op.process.startswith(process + ":")
        and op.type == FAIL
        and str(op.get("error", "")).startswith("LEASE_LOST")
    ]


def takeovers(ops: list[Op], process: str) -> int:
    """The expired leases a process took over."""
    return sum(
        bool(grant.get("takeover"))
        for op in ops
        if op.process.startswith(process + ":") and op.type == OK
        for grant in op.get("grants") or []
    )


def test_python_and_node_workers_share_a_run_and_the_history_holds(
    node: str, redis_url: str, real_store: LeaseStore, tmp_path: Path
) -> None:
    store = real_store
    ids = [f"acct_{n}:cursor_{n % 7}" for n in range(ITEMS)]
    store.add(RUN, [Item(i, {"n": n}) for n, i in enumerate(ids)], shards=SHARDS)
    history = tmp_path / "history"
    history.mkdir()

    ctx = multiprocessing.get_context("spawn")
    go = ctx.Barrier(2)
    python = ctx.Process(target=python_worker, args=(redis_url, store.prefix, str(history), go))
    python.start()
    go.wait(60)
    command = [node, str(NODE_DIR / "worker.js"), "--url", redis_url, "--prefix", store.prefix]
    command += ["--run", RUN, "--worker", "node", "--ttl-ms", str(TTL_MS), "--batch", "5"]
    command += ["--handle-ms", str(HANDLE_MS), "--timeout-s", "120"]
    env = {**os.environ, "HISTORY_FILE": str(history / "node.jsonl")}
    worker = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert python.pid is not None
        node_held = pause_past_leases(store, worker.pid, "node")
        python_held = pause_past_leases(store, python.pid, "py")
        out, _ = worker.communicate(timeout=120)
        python.join(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        worker.wait(timeout=10)
        python.kill()
        python.join(timeout=10)
    assert (worker.returncode, python.exitcode) == (0, 0)
    node_summary = json.loads(out.splitlines()[-1])
    assert node_held and python_held

    Runs(store).finalize(RUN, "every item is done")
    evidence = collect(store, RUN, ids, history_dir=history, applied={}, marked=False)
    summary = check(evidence)
    assert summary.accepted_commits == summary.done == ITEMS
    assert store.status(RUN).counts == {"pending": 0, "leased": 0, "done": ITEMS, "dead": 0}
    commits = {
        process: sum(
            op.type == OK and op.get("f") == "commit" and not op.get("repeated")
            for op in evidence.ops
            if op.process.startswith(process + ":")
        )
        for process in ("py", "node")
    }
    assert commits["py"] + commits["node"] == ITEMS
    assert commits["node"] == node_summary["committed"] > 0
    # each took over the other's expired leases, and each was refused after its pause
    assert takeovers(evidence.ops, "py") > 0 and takeovers(evidence.ops, "node") > 0
    assert refusals(evidence.ops, "py") and refusals(evidence.ops, "node")
    assert node_summary["stale"] == len(refusals(evidence.ops, "node"))
