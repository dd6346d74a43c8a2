-- run_transition: move a run to a new state if it is in one of the expected
-- states, recording the change with its time and reason in the run's event log.
--
-- KEYS[1] run: hash, the run's record (tag {<run_id>})
-- KEYS[2] events: stream, the run's event log (same tag)
-- ARGV[1] expected states, comma-separated, '*' for any (text, bound text_bytes)
-- ARGV[2] new state (one of planning|running|succeeded|partial|failed|canceled)
-- ARGV[3] reason (text, bound text_bytes)
-- ARGV[4...] optional field (id), value (text, bound text_bytes) pairs set with the change
--   (e.g. deadline_at, final counts); at most guard_specs pairs
--
-- Returns: {1, previous state, now ms} when changed; {0, current state, now ms} when not
-- Errors: INVALID <what>; NOT_FOUND run=<id>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}, {'events', 'stream'}}
-- Every state a run is stored in: the open ones, then the final ones.
local STATES = {}
for _, part in ipairs({LIMITS.run_states.open, LIMITS.run_states.final}) do
  for _, s in ipairs(part) do STATES[#STATES + 1] = s end
end

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A, fields
  A, bad = check_args({{1, 'text', 'text_bytes'}, {2, 'one', STATES}, {3, 'text', 'text_bytes'}})
  if bad then return bad end
  fields, bad = check_rest(4, {{'id'}, {'text', 'text_bytes'}}, 'guard_specs')
  if bad then return bad end
  local state = rcall('HGET', KEYS[1], 'state')
  if not state then return fail('NOT_FOUND', 'run=' .. (KEYS[1]:match('{(.-)}') or KEYS[1])) end
  local now = now_ms()
  local allowed = A[1] == '*'
  for s in string.gmatch(A[1], '[^,]+') do
    if s == state then allowed = true end
  end
  if not allowed then return {0, state, now} end
  rcall('HSET', KEYS[1], 'state', A[2], 'state_at', now, 'reason', A[3])
  for _, pair in ipairs(fields) do rcall('HSET', KEYS[1], pair[1], pair[2]) end
  rcall('XADD', KEYS[2], 'MAXLEN', '~', LIMITS.defaults.run_log, '*', 'kind', 'state',
    'from', state, 'to', A[2], 'reason', A[3], 'at', now)
  return {1, state, now}
end

return main()
