"""When runs start and end: the scheduler tick (:mod:`.scheduler_tick`) and what it does to
each open run (:mod:`.open_runs`), due and missed runs (:mod:`.due_runs`,
:mod:`.missed_runs`), lost runs made again (:mod:`.lost_runs`), backfill (:mod:`.backfill`)
and the installed schedule (:mod:`.schedule`)."""
