"""Nightly jobs: a job's definition (:mod:`.job`), its options (:mod:`.job_options`) and
the lease its handler works under (:mod:`.live_lease`)."""
