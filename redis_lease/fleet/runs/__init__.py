"""Runs of a job: creating, planning, changing and finalizing them (:mod:`.lifecycle`), their
states (:mod:`.run_states`), an operator's hand on a run (:mod:`.run_control`), a run's
oldest eligible age over time (:mod:`.run_ages`) and per-job counts of runs
(:mod:`.job_tallies`)."""
