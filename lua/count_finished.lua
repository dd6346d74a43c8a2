-- count_finished: count a run's end in its job's tallies, once per end. The end is kept in
-- the job's counted ends until its expiry passes (when the run's keys are gone and that end
-- cannot come again); ends past their expiry leave on each call.
--
-- KEYS[1] tallies: hash, the job's counters (finished:<state>, missed, lost)
-- KEYS[2] finished_runs: zset, the counted ends, <run_id>@<state_at ms> -> ms it may go
-- ARGV[1] the end, <run_id>@<state_at ms> (text, bound key_length)
-- ARGV[2] the final state (one of succeeded|partial|failed|canceled)
-- ARGV[3] ms the end is kept from now (int, bound time_ms)
--
-- Returns: 1 when counted now, 0 when this end was counted before
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'tallies', 'hash'}, {'finished_runs', 'zset'}}
local FINAL = LIMITS.run_states.final

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'text', 'key_length'}, {2, 'one', FINAL}, {3, 'int', 'time_ms'}})
  if bad then return bad end
  local now = now_ms()
  rcall('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
  if rcall('ZADD', KEYS[2], 'NX', now + A[3], A[1]) == 0 then return 0 end
  rcall('HINCRBY', KEYS[1], 'finished:' .. A[2], 1)
  return 1
end

return main()
