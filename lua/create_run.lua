-- create_run: create a run record once; later calls change nothing.
--
-- KEYS[1] run: hash, the run's record (tag {<run_id>})
-- ARGV[1] run id (id)
-- ARGV[2] shard count (int, bound shard_count)
-- ARGV[3] initial state, default running (one of planning|running)
-- ARGV[4...] field (id), value (text, bound text_bytes) pairs stored with a new run
--   (job, business date, deadline); at most guard_specs pairs
--
-- Returns: {1 when created now else 0, the run's shard count, created_at ms}
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{false, 'hash'}}
local OPEN = LIMITS.run_states.open  -- planning, running: a run starts running unless told

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A, fields
  A, bad = check_args({{1, 'id'}, {2, 'int', 'shard_count'}, {3, 'one', OPEN, OPEN[2]}})
  if bad then return bad end
  fields, bad = check_rest(4, {{'id'}, {'text', 'text_bytes'}}, 'guard_specs')
  if bad then return bad end
  local key = KEYS[1]
  if rcall('HSETNX', key, 'run_id', A[1]) == 0 then
    return {0, tonumber(rcall('HGET', key, 'shards')), tonumber(rcall('HGET', key, 'created_at'))}
  end
  local now = now_ms()
  rcall('HSET', key, 'shards', A[2], 'created_at', now, 'state', A[3], 'state_at', now)
  for _, pair in ipairs(fields) do rcall('HSET', key, pair[1], pair[2]) end
  return {1, A[2], now}
end

return main()
