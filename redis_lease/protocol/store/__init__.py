"""The lease store: :class:`~.lease_store.LeaseStore` (runs, items, the maintenance of
leases), its claims (:mod:`.claims`), what a lease's holder does (:mod:`.holder`: renew,
commit, fail, release, effects), its plumbing (:mod:`.store_client`), adding items (:mod:`.add`),
committing, failing or releasing many leases in one call (:mod:`.settle_encoding`), reads
(:mod:`.reads`), a run's status (:mod:`.run_status`), the attempt log (:mod:`.attempt_log`)
and the protocol stamp (:mod:`.stamp`)."""
