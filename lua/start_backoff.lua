-- start_backoff: start a run's dispatch back-off, if its streak of failed shard jobs is
-- still the one the back-off was decided on.
--
-- KEYS[1] run: hash, the run's record (tag {<run_id>})
-- ARGV[1] the streak the back-off was decided on (int, bound tally)
-- ARGV[2] when the back-off ends, ms on the deciding tick's clock (int, bound time_ms)
--
-- Returns: 1 when the back-off was set, 0 when the streak changed meanwhile
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local _, refused = check_args({{1, 'int', 'tally'}, {2, 'int', 'time_ms'}})
  if refused then return refused end
  local run = KEYS[1]
  if rcall('HGET', run, 'job_failure_streak') ~= ARGV[1] then return 0 end
  rcall('HSET', run, 'dispatch_backoff_until', ARGV[2], 'dispatch_backoff_streak', ARGV[1])
  return 1
end

return main()
