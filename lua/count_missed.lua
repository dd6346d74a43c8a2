-- count_missed: mark business dates of a job skipped and count those with no entry before
-- (no run made for them, not marked before) as missed, in one step.
--
-- KEYS[1] tallies: hash, the job's counters (finished:<state>, missed, lost)
-- KEYS[2] dates: zset, the job's business dates, ISO date -> created ms (0: skipped)
-- ARGV[1...] the dates to mark skipped, ISO (id); at most batch ids
--
-- Returns: the dates marked now, each counted as missed
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'tallies', 'hash'}, {'dates', 'zset'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local days
  days, bad = check_rest(1, {{'id'}}, 'batch')
  if bad then return bad end
  local marked = {}
  for _, group in ipairs(days) do
    if rcall('ZADD', KEYS[2], 'NX', 0, group[1]) == 1 then marked[#marked + 1] = group[1] end
  end
  if #marked > 0 then rcall('HINCRBY', KEYS[1], 'missed', #marked) end
  return marked
end

return main()
