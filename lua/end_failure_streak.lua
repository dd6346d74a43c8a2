-- end_failure_streak: end a run's streak of failed shard jobs and its dispatch back-off
-- together, in one step (a failure counted meanwhile is never lost). Writes nothing when
-- there is no streak and no back-off.
--
-- KEYS[1] run: hash, the run's record (tag {<run_id>})
-- (no ARGV)
--
-- Returns: 1 when it wrote, 0 when there was nothing to end
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local run = KEYS[1]
  local streak, seen = unpack(rcall('HMGET', run, 'job_failure_streak', 'dispatch_backoff_streak'))
  if (streak or '0') == '0' and (seen or '0') == '0' then return 0 end
  rcall('HSET', run, 'job_failure_streak', '0', 'dispatch_backoff_streak', '0')
  rcall('HDEL', run, 'dispatch_backoff_until')
  return 1
end

return main()
