"""The fleet: nightly jobs (:mod:`.job`), runs and their states (:mod:`.runs`,
:mod:`.run_states`), effects and the provider gate (:mod:`.effects`, :mod:`.gate`), a
handler's live lease (:mod:`.live_lease`), capacity (:mod:`.capacity`, :mod:`.run_capacity`),
RQ shard jobs (:mod:`.shard_jobs`, their failures, back-off and takeover) and loss
(:mod:`.data_set`, :mod:`.remembered`, :mod:`.lost_records`). Above it: what a worker
process does (:mod:`.worker`) and when runs start and end (:mod:`.tick`), which do not
import each other.
"""
