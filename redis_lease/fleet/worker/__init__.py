"""What a worker process does.

The modules: the RQ job function (:mod:`.shard_job`), the RQ worker classes
(:mod:`.rq_worker`), the loop over one shard (:mod:`.shard_loop`), the commits, fails and
releases of finished handlers (:mod:`.handler_outcomes`), lease renewal and the heartbeat
(:mod:`.lease_keeper`), the handler pool (:mod:`.pool`), the worker heartbeat and the
takeover of dead shard jobs (:mod:`.watch`), and the jobs it cannot run
(:mod:`.bad_jobs`)."""
