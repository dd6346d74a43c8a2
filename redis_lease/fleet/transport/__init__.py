"""RQ as the transport: shard jobs on queues and the store an RQ job works on
(:mod:`.shard_jobs`), shard jobs that fail and the dispatch back-off
(:mod:`.shard_job_failures`), and taking over the work of a shard job that stopped
(:mod:`.takeover`)."""
