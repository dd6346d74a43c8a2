"""What a worker process does: the RQ job function (:mod:`.shard_job`), the RQ worker
classes (:mod:`.rq_worker`), the loop over one shard (:mod:`.shard_loop`) and the settling of
what its handlers ended (:mod:`.handler_outcomes`), the keeper of its leases
(:mod:`.lease_keeper`), the handler pool (:mod:`.pool`), the watch over the fleet
(:mod:`.watch`) and the jobs it cannot run (:mod:`.bad_jobs`)."""
