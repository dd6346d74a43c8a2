"""Hostile values in every field a user or a worker can set, for the dashboard's safety tests.

:func:`build` fills a private Redis (never a shared one: it plants members of RQ's global
sets) with a run, its items, decisions and attempts, RQ queues, jobs and workers, each
field holding :func:`markup` that would run script, load a URL or navigate if any page
rendered it as HTML, or bytes that are not UTF-8, or very long text. What the library
accepts is written through it (payloads, errors, reasons, RQ descriptions and exception
texts, made by a real RQ worker); what it refuses (ids, worker names, lease owners,
bytes) is written straight into Redis, as anyone holding the documented worker ACL could.
:func:`crawl` then follows every link from the dashboard's front pages; :func:`snapshot`
records every key, so a test can show that looking changed nothing.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import redis

from redis_lease import LeaseStore
from redis_lease.fleet.runs.lifecycle import Runs
from redis_lease.fleet.transport import shard_jobs
from redis_lease.fleet.transport.shard_job_failures import record_job_failure
from redis_lease.fleet.transport.takeover import ShardJob
from redis_lease.protocol.leases import Item
from tests.rq_helpers import burst, pickled_call

#: The valid runs the world makes.
RUN = "web:2026-12-01"
BYTES_RUN = "bytes:2026-12-01"
QUEUE = "hostile-q"
#: Very long text (a planted RQ description; an error and a payload near their limits).
LONG = "long " * 40_000
#: Bytes that are not UTF-8 around markup.
NOT_UTF8 = b"\xff\xfe\x80<b>\xc3\x28</b>"
#: The global a script in a hostile value would set, and the text that names a field.
FLAG = "__pwned"


def marker(name: str) -> str:
    """The text naming field ``name`` inside its hostile value (seen when shown as text)."""
    return f"{FLAG}='{name}'"


def markup(name: str, sink: str) -> str:
    """Markup that would set ``window.__pwned``, open a dialog, load ``sink`` or navigate
    if a page ever rendered it as HTML: quotes of both kinds to leave an attribute, a
    script, handlers, ``javascript:`` URLs, an image and a refresh pointing at the sink."""
    run = f"window.{marker(name)};alert('{name}')"
    return (
        f"\"'></textarea></pre><script>{run}</script>"
        f'<img src=x onerror="{run}"><svg onload="{run}"></svg>'
        f"<img src='{sink}?{name}'><a href=\"javascript:{run}\">x</a>"
        f'<iframe src="javascript:{run}"></iframe>'
        f'<meta http-equiv="refresh" content="0;url={sink}?{name}">'
        f"javascript:{run}"
    )


def segment(name: str) -> str:
    """``name`` as one path segment of the dashboard's URLs (``/`` written ``~``)."""
    return quote(name.replace("/", "~"), safe="~")


@dataclass
class HostileWorld:
    """What :func:`build` made: the fields shown as markup, and URLs no link leads to."""

    #: Field name -> its hostile value, for the fields a page shows as text.
    shown: dict[str, str] = field(default_factory=dict)
    #: Pages asked for directly (ids no page links: invalid ones, planted ones).
    direct: list[str] = field(default_factory=list)


def build(store: LeaseStore, sink: str) -> HostileWorld:
    """Fills the store's (private) Redis with hostile values; see the module's docstring."""
    world = HostileWorld()
    _lease_state(store, sink, world)
    _bytes_run(store, world)
    _rq_state(store, sink, world)
    _lease_workers(store, sink, world)
    for key in store.client.scan_iter(count=1000):  # nothing expires while the test looks
        store.client.persist(key)
    return world


def _hostile(world: HostileWorld, name: str, sink: str) -> str:
    value = markup(name, sink)
    world.shown[name] = value
    return value


def _lease_state(store: LeaseStore, sink: str, world: HostileWorld) -> None:
    """A run whose every text field is markup: through the library where it accepts it."""
    client, keys = store.client, store.keys
    job = _hostile(world, "run job", sink)
    store.create_run(RUN, 1, fields={"job": job, "business_date": "2026-12-01"})
    payload = {"note": _hostile(world, "payload", sink), "long": "p" * 60_000}
    store.add(RUN, [Item("acct:1", payload), Item("acct:2"), Item("acct:3")])
    error = _hostile(world, "item error", sink)
    store.fail(store.claim(RUN, "acct:1", "w1"), error + LONG, permanent=True)
    store.claim(RUN, "acct:3", "w2")
    Runs(store).record_decision(RUN, "created", _hostile(world, "decision reason", sink))
    record_job_failure(store, RUN, 0, _hostile(world, "shard job error", sink))

    items = keys.shard(RUN, 0)[2]
    owner = _hostile(world, "lease owner", sink).replace("|", "/")
    record = client.hget(items, "acct:3")
    assert record is not None
    client.hset(items, "acct:3", record.replace(b"|w2|", f"|{owner}|".encode()))
    # An item id the library refuses, dead, with a record and an error.
    item_id = _hostile(world, "item id", sink)
    client.hset(items, item_id, client.hget(items, "acct:1") or b"")
    client.hset(items, f"{item_id}#e", client.hget(items, "acct:1#e") or b"")
    client.zadd(keys.shard(RUN, 0)[6], {item_id: 1})
    worker = _hostile(world, "attempt worker", sink)
    client.xadd(
        keys.attempts(RUN, 0),
        {"item": "acct:1", "attempt": "2", "token": "9", "event": "dead", "queue_ms": "1"}
        | {"run_ms": "1", "worker": worker, "trace": "t" * 32, "error": worker, "label": ""},
    )
    run_id = _hostile(world, "run id", sink)
    client.zadd(keys.runs, {run_id: 1, NOT_UTF8: 2})
    world.direct += [
        f"/runs/{segment(run_id)}",
        f"/runs/{RUN}/items/{segment(item_id)}",
        f"/runs/{RUN}/items/acct:2",
        f"/runs/{RUN}/items/acct:3",
    ]


def _bytes_run(store: LeaseStore, world: HostileWorld) -> None:
    """A run whose items hold bytes that are not UTF-8: an error, an owner, a payload."""
    client, keys = store.client, store.keys
    store.add(BYTES_RUN, [Item("b1"), Item("b2"), Item("b3", {"n": "payload"})], shards=1)
    store.fail(store.claim(BYTES_RUN, "b1", "w1"), "plain error", permanent=True)
    store.claim(BYTES_RUN, "b2", "w2")
    items = keys.shard(BYTES_RUN, 0)[2]
    client.hset(items, "b1#e", b'[{"attempt":1,"error":"' + NOT_UTF8 + b'","at":1}]')
    record = client.hget(items, "b2") or b""
    client.hset(items, "b2", record.replace(b"|w2|", b"|w" + NOT_UTF8 + b"|"))
    record = client.hget(items, "b3") or b""
    client.hset(items, "b3", record.replace(b'"payload"', b'"' + NOT_UTF8 + b'"'))
    client.xadd(keys.run_events(BYTES_RUN), {"kind": NOT_UTF8, "reason": NOT_UTF8})
    client.xadd(keys.attempts(BYTES_RUN, 0), {"item": "b1", "worker": NOT_UTF8, "event": "dead"})
    world.direct += [f"/runs/{BYTES_RUN}/items/{item}" for item in ("b1", "b2", "b3")]


def _rq_state(store: LeaseStore, sink: str, world: HostileWorld) -> None:
    """RQ's queues, jobs and workers with markup, bytes and long text in their fields."""
    client = store.rq
    queue = shard_jobs.queue(client, QUEUE)
    queue.enqueue(
        "tests.rq_helpers.raise_error",
        _hostile(world, "rq exception", sink),
        description=_hostile(world, "rq description", sink),
    )
    burst(client, QUEUE, "hostile-burst")
    queue.enqueue("builtins.len", "waits", description=LONG)
    job_id = _hostile(world, "rq job id", sink)
    _job(client, job_id.encode(), {"status": "failed", "origin": QUEUE, "description": job_id})
    _job(
        client,
        b"rq-bytes",
        {"status": b"failed" + NOT_UTF8, "origin": QUEUE, "description": NOT_UTF8}
        | {"exc_info": NOT_UTF8, "data": pickled_call(), "meta": b"\x80\x04garbage"},
    )
    name = _hostile(world, "rq worker name", sink)
    _worker(client, name.encode(), job_id.encode(), _hostile(world, "rq worker state", sink))
    _worker(client, b"w" + NOT_UTF8, b"rq-bytes", "busy")
    queue_name = _hostile(world, "rq queue name", sink)
    for raw in (queue_name.encode(), NOT_UTF8):
        client.sadd("rq:queues", b"rq:queue:" + raw)
        client.rpush(b"rq:queue:" + raw, b"rq-bytes", job_id.encode())
    world.direct += [
        f"/rq/0/view/jobs/{segment(queue_name)}/queued",
        f"/rq/0/view/job/{quote(job_id, safe='')}",
        f"/rq/0/data/job/{quote(job_id, safe='')}.json",
        "/rq/0/view/job/rq-bytes",
        "/rq/0/data/job/rq-bytes.json",
        f"/rq/0/data/jobs/{QUEUE}/failed.json",
        "/rq/0/data/queues.json",
        "/rq/0/data/workers.json",
    ]


def _lease_workers(store: LeaseStore, sink: str, world: HostileWorld) -> None:
    """The fleet's own records of its workers (the Workers page): their records and beats,
    a shard job at work and a takeover, with markup and bytes where anyone could write."""
    client, keys = store.client, store.keys
    records, seen = keys.workers
    name = _hostile(world, "worker name", sink)
    record = {"host": _hostile(world, "worker host", sink), "pid": 7}
    record["queues"] = [_hostile(world, "worker queue", sink)]
    client.hset(records, mapping={name: json.dumps(record), NOT_UTF8: NOT_UTF8 + b"{"})
    now_ms = int(client.time()[0]) * 1000
    client.zadd(seen, {name: now_ms, NOT_UTF8: now_ms - 60_000})
    job = ShardJob(
        rq_id="rl-hostile",
        run_id=RUN,
        shard=0,
        worker=_hostile(world, "shard job worker", sink),
        owner="host:1:hostile",
        host=_hostile(world, "shard job host", sink),
        pid=8,
        path="tests.fleet_jobs:fleet",
        queue=QUEUE,
        budget=30.0,
    )
    entries, beats, _taking, _clock = keys.shard_job_registry
    client.hset(entries, mapping={job.rq_id: job.to_json(), NOT_UTF8: NOT_UTF8})
    client.zadd(beats, {job.rq_id: now_ms, NOT_UTF8: now_ms})
    client.set(keys.run_beat(RUN, job.rq_id), NOT_UTF8)
    taken = {"worker": _hostile(world, "taken over worker", sink), "run_id": RUN, "shard": 0}
    taken |= {"rq_id": markup("taken over job", sink), "leases": 2, "at_ms": now_ms}
    client.lpush(keys.takeovers, json.dumps(taken), NOT_UTF8, b"[1]")


def _job(client: redis.Redis, job_id: bytes, fields: dict[str, bytes | str]) -> None:
    """A job hash written as given, listed in the hostile queue's failed registry."""
    client.hset(b"rq:job:" + job_id, mapping=fields)  # type: ignore[arg-type]
    client.zadd(f"rq:failed:{QUEUE}", {job_id: 1})


def _worker(client: redis.Redis, name: bytes, job_id: bytes, state: str) -> None:
    """A worker registered as RQ registers one, running ``job_id`` (a live execution)."""
    key = b"rq:worker:" + name
    fields = {"state": state, "queues": f"{QUEUE},other", "pid": "1", "hostname": state}
    client.hset(key, mapping=fields | {"birth": "2026-12-01T00:00:00Z"})
    client.sadd("rq:workers", key)
    client.sadd(key + b":executions", job_id + b":e1")
    client.hset(b"rq:execution:" + job_id + b":e1", mapping={"job_id": job_id})


# -- looking ---------------------------------------------------------------------------


def snapshot(client: redis.Redis) -> dict[bytes, tuple[bytes, Any, bool]]:
    """Every key of the (private) Redis: its type, its value and whether it expires.

    Values are read, not DUMPed: a hash or set stored as a hash table may change its
    order (so its DUMP) on reads alone, while Redis finishes a resize.
    """
    readers: dict[bytes, Callable[[bytes], Any]] = {
        b"string": client.get,
        b"list": lambda key: client.lrange(key, 0, -1),
        b"hash": lambda key: sorted(client.hgetall(key).items()),
        b"set": lambda key: sorted(client.smembers(key)),
        b"zset": lambda key: client.zrange(key, 0, -1, withscores=True),
        b"stream": lambda key: client.xrange(key),
    }
    found = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        found[key] = (kind, readers[kind](key), client.ttl(key) != -1)
    return found


#: Where a crawl starts: the front pages.
START = ("/", "/rq/")


def crawl(
    fetch: Callable[[str], Iterable[str]], extra: Iterable[str], limit: int = 300
) -> list[str]:
    """Every same-origin page reachable from :data:`START` by links, then ``extra``, each
    asked for once with ``fetch`` (which returns the page's link targets); the URLs
    asked for. A form's action is never followed: looking must change nothing."""
    seen: list[str] = []
    todo = deque([*START, *extra])
    while todo and len(seen) < limit:
        url = todo.popleft()
        if url in seen:
            continue
        seen.append(url)
        for href in fetch(url):
            target = urljoin(url, href)
            parts = urlsplit(target)
            if not parts.scheme and not parts.netloc and target not in seen:
                todo.append(target)
    assert len(seen) < limit, f"more than {limit} pages: a link loops"
    return seen


def fields_shown(text: str, world: HostileWorld) -> set[str]:
    """The hostile fields whose marker ``text`` (a page's text, or JSON) holds."""
    try:
        haystack = json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        haystack = text
    return {name for name in world.shown if marker(name) in haystack}
