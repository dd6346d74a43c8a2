"""The lease store: :class:`~.lease_store.LeaseStore` (items, leases, claims, commits),
its plumbing (:mod:`.base`), adding items (:mod:`.add`), settling many leases
(:mod:`.settle`), reads (:mod:`.reads`), a run's status (:mod:`.run_status`), the attempt log
(:mod:`.attempt_log`) and the protocol stamp (:mod:`.stamp`)."""
