-- create_run: create a run record once; later calls change nothing.
--
-- KEYS[1] the run's hash (tag {<run_id>})
-- ARGV[1] run id
-- ARGV[2] shard count
-- ARGV[3] initial state (optional, default 'running')
-- ARGV[4...] optional field, value pairs stored with a new run (job, business date, deadline)
--
-- Returns: {1 when created now else 0, the run's shard count, created_at ms}
local rcall = redis.call

local function main()
  local key = KEYS[1]
  if rcall('HSETNX', key, 'run_id', ARGV[1]) == 0 then
    return {0, tonumber(rcall('HGET', key, 'shards')), tonumber(rcall('HGET', key, 'created_at'))}
  end
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  rcall('HSET', key, 'shards', ARGV[2], 'created_at', now, 'state', ARGV[3] or 'running',
    'state_at', now)
  for i = 4, #ARGV, 2 do rcall('HSET', key, ARGV[i], ARGV[i + 1]) end
  return {1, tonumber(ARGV[2]), now}
end

return main()
