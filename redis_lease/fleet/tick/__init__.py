"""When runs start and end: the scheduler tick (:mod:`.scheduler_tick`) and what it does to
each open run (:mod:`.open_runs`), due and missed runs (:mod:`.due_runs`,
:mod:`.missed_runs`), backfill (:mod:`.backfill`), the installed schedule
(:mod:`.schedule`) and the worker that ticks (:mod:`.leader`). Lost runs made again are
:mod:`redis_lease.fleet.loss.lost_runs`."""
