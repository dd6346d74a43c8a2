-- record_job_failure: count a failed shard job on its run, with its error and when it
-- failed, and lengthen the run's streak of failed shard jobs. A run without a record
-- (deleted meanwhile by retention) is not made again.
--
-- KEYS[1] run: hash, the run's record (tag {<run_id>})
-- ARGV[1] the error, one line (text, bound error_bytes)
--
-- Returns: the streak of failed shard jobs after this one; -1 when the run has no record
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'text', 'error_bytes'}})
  if bad then return bad end
  local run = KEYS[1]
  if rcall('EXISTS', run) == 0 then return -1 end
  local now = now_ms()
  rcall('HINCRBY', run, 'failed_jobs', 1)
  local streak = rcall('HINCRBY', run, 'job_failure_streak', 1)
  rcall('HSET', run, 'last_job_error', A[1], 'last_job_error_at', now)
  return streak
end

return main()
