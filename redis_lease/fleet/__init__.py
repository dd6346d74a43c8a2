"""The fleet: one folder per concept. Nightly jobs and the lease a handler works under
(:mod:`.jobs`), runs and their bookkeeping (:mod:`.runs`), effects and the provider gate
(:mod:`.effects`), capacity (:mod:`.capacity`), RQ as the transport of shard jobs, with
their failures and takeover (:mod:`.transport`), and loss of the data set or of a run
(:mod:`.loss`); beside them, a worker on a full Redis (:mod:`.full_redis`). Above them:
what a worker process does (:mod:`.worker`) and when runs start and end (:mod:`.tick`),
which do not import each other.
"""
