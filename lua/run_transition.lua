-- run_transition: move a run to a new state if it is in one of the expected
-- states, recording the change with its time and reason in the run's event log.
--
-- KEYS[1] the run's hash (tag {<run_id>})
-- KEYS[2] the run's event log (stream, same tag)
-- ARGV[1] expected states, comma-separated ('*' for any)
-- ARGV[2] new state
-- ARGV[3] reason (text)
-- ARGV[4...] optional field, value pairs set with the change (e.g. deadline_at, final counts)
--
-- Returns: {1, previous state, now ms} when changed; {0, current state, now ms} when not
-- Errors: NOT_FOUND run=<id>; INVALID for an odd number of field/value arguments
local rcall = redis.call

local function main()
  if (#ARGV - 3) % 2 ~= 0 then return redis.error_reply('INVALID fields must be name, value pairs') end
  local state = rcall('HGET', KEYS[1], 'state')
  if not state then return redis.error_reply('NOT_FOUND run=' .. KEYS[1]) end
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local allowed = ARGV[1] == '*'
  for s in string.gmatch(ARGV[1], '[^,]+') do
    if s == state then allowed = true end
  end
  if not allowed then return {0, state, now} end
  rcall('HSET', KEYS[1], 'state', ARGV[2], 'state_at', now, 'reason', ARGV[3])
  for i = 4, #ARGV, 2 do rcall('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
  rcall('XADD', KEYS[2], 'MAXLEN', '~', 1000, '*', 'kind', 'state', 'from', state, 'to', ARGV[2],
    'reason', ARGV[3], 'at', now)
  return {1, state, now}
end

return main()
