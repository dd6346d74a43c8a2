"""What the RQ pages change, as plain POST forms: requeue a failed job, delete a job,
requeue every failed job of a queue, empty a queue or registry, compact a queue.

Each form carries the CSRF token (checked for every POST) and the page to go back to; an
action answers 303 to that page, with a line saying what it did. Other methods are 405;
``--read-only`` refuses every POST (403) before it gets here. A job RQ cannot read (bytes
that are not UTF-8, a pickled call) is left as it is, and the line says so: the others go on.
A requeue is refused at once on a full Redis (:func:`.fullness.refuse_when_full`); deleting,
emptying and compacting free memory, and a full Redis allows them.
"""

from __future__ import annotations

import re
from typing import cast

import redis
from flask import Blueprint, flash, redirect, request, url_for
from rq.exceptions import InvalidJobOperation
from rq.job import Job
from rq.queue import Queue
from werkzeug.wrappers import Response

from ...fleet.transport.shard_jobs import JsonJob
from ...fleet.transport.shard_jobs import queue as json_queue
from . import rq_data
from .fullness import refuse_when_full
from .ids import CONVERTER
from .rq_source import RQ_PREFIX, known_job, known_queue, known_registry, reading, store

rq_actions = Blueprint("rq_actions", __name__, url_prefix=RQ_PREFIX)

#: A page to go back to: a path under /rq/, in URL characters only.
_BACK = re.compile(rf"{RQ_PREFIX}/[A-Za-z0-9._~!$&'()*+,;=:@%/?-]*")


def back_to() -> Response:
    """303 to the page the form named (a path under /rq/), else to the queues page."""
    target = request.form.get("back", "")
    if _BACK.fullmatch(target) and not target.startswith("//"):
        return redirect(request.script_root + target, code=303)
    return redirect(url_for("rq.queues"), code=303)


def _rq_job(conn: redis.Redis, job_id: str) -> Job | None:
    """The job as RQ reads it (JSON), or None when RQ cannot read it (what RQ raises then
    varies: a decoding error, a bad status or id, a key of another type, ...); Redis being
    unreachable is raised."""
    try:
        return JsonJob.fetch(job_id, connection=conn)
    except (redis.ConnectionError, redis.TimeoutError):
        raise
    except Exception:
        return None


def _job_to_change(conn: redis.Redis, job_id: str) -> Job | None:
    """The job as RQ reads it; NotFound (404) when it is not in Redis; None, said on the
    page, when RQ cannot read it."""
    known_job(conn, job_id)
    job = _rq_job(conn, job_id)
    if job is None:
        flash(f"job {job_id}: RQ cannot read it (see its page): left as it is", "error")
    return job


@rq_actions.post("/job/<path:job_id>/requeue")
def requeue_job(job_id: str) -> Response:
    """Moves a failed job back to its queue (refused at once on a full Redis)."""
    refuse_when_full(store())
    with reading() as conn:
        job = _job_to_change(conn, job_id)
        if job is None:
            return back_to()
        try:
            job.requeue()
        except InvalidJobOperation:
            flash(f"job {job_id} is not in the failed registry: left as it is", "error")
        else:
            flash(f"job {job_id} requeued on {job.origin}", "ok")
    return back_to()


@rq_actions.post("/job/<path:job_id>/delete")
def delete_job(job_id: str) -> Response:
    """Deletes a job: its hash, its results, its place in its queue and registries."""
    with reading() as conn:
        job = _job_to_change(conn, job_id)
        if job is not None:
            job.delete()
            flash(f"job {job_id} deleted", "ok")
    return back_to()


@rq_actions.post(f"/requeue/<{CONVERTER}:queue>")
def requeue_all(queue: str) -> Response:
    """Moves every failed job of ``queue`` back to it (refused at once on a full Redis)."""
    refuse_when_full(store())
    with reading() as conn:
        known_queue(conn, queue)
        done = left = 0
        for member in rq_data.members(conn, queue.encode(), "failed"):
            job = _rq_job(conn, rq_data.text(member)) if rq_data.is_text(member) else None
            try:
                if job is None:
                    raise InvalidJobOperation
                job.requeue()
                done += 1
            except InvalidJobOperation:
                left += 1
    tail = f"; {left} left: RQ cannot read them (or they moved meanwhile)" if left else ""
    flash(f"{done} failed job(s) of {queue} requeued{tail}", "error" if left else "ok")
    return back_to()


@rq_actions.post(f"/queue/<{CONVERTER}:queue>/<registry>/empty")
def empty(queue: str, registry: str) -> Response:
    """Deletes every job of ``queue``'s list or one of its registries."""
    known_registry(registry)
    with reading() as conn:
        known_queue(conn, queue)
        if registry == "queued":
            deleted = json_queue(conn, queue).empty()  # type: ignore[no-untyped-call]
            flash(f"queue {queue} emptied: {deleted} job(s) deleted", "ok")
            return back_to()
        deleted = left = 0
        key = rq_data.registry_key(queue.encode(), registry)
        for member in rq_data.members(conn, queue.encode(), registry):
            raw_id = rq_data.job_id_of(member, registry)
            if not conn.exists(Job.redis_job_namespace_prefix.encode() + raw_id):
                conn.zrem(key, member)  # the job is gone: its entry goes too
                deleted += 1
                continue
            job = _rq_job(conn, rq_data.text(raw_id)) if rq_data.is_text(raw_id) else None
            if job is None:
                left += 1
                continue
            job.delete()
            deleted += 1
    tail = f"; {left} left: RQ cannot read them" if left else ""
    flash(f"{registry} of {queue} emptied: {deleted} deleted{tail}", "error" if left else "ok")
    return back_to()


@rq_actions.post(f"/queue/<{CONVERTER}:queue>/compact")
def compact(queue: str) -> Response:
    """Removes from ``queue``'s list the ids of jobs that are gone, keeping its order.

    RQ's own ``Queue.compact`` renames the list away while it works (workers see an empty
    queue meanwhile) and stops half way on an id that is not UTF-8, losing the rest; this
    removes each gone id where it is (LREM).
    """
    with reading() as conn:
        known_queue(conn, queue)
        key = Queue.redis_queue_namespace_prefix.encode() + queue.encode()
        ids = list(dict.fromkeys(rq_data.members(conn, queue.encode(), "queued")))
        with conn.pipeline(transaction=False) as pipe:
            for raw_id in ids:
                pipe.exists(Job.redis_job_namespace_prefix.encode() + raw_id)
            present = pipe.execute()
        gone = [raw_id for raw_id, there in zip(ids, present, strict=True) if not there]
        with conn.pipeline(transaction=False) as pipe:
            for raw_id in gone:
                pipe.lrem(key, 0, cast(str, raw_id))  # bytes are sent as they are
            pipe.execute()
    flash(f"queue {queue} compacted: {len(gone)} id(s) of gone jobs removed", "ok")
    return back_to()
