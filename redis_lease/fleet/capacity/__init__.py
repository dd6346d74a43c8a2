"""Capacity: the planning model (:mod:`.model`), what a run's workers measure and need
(:mod:`.run_capacity`) and a plan from what an operator gives (:mod:`.capacity_ask`)."""
