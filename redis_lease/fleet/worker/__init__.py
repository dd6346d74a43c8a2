"""What a worker process does: the RQ job function (:mod:`.shard_job`), the RQ worker
classes (:mod:`.rq_worker`), the loop over one shard (:mod:`.shard_loop`), the handler pool
(:mod:`.pool`), the watch over the fleet (:mod:`.watch`) and the jobs it cannot run
(:mod:`.bad_jobs`, :mod:`.bad_job_counts`)."""
