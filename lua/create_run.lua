-- create_run: create a run record once; later calls change nothing.
--
-- KEYS[1] the run's hash (tag {<run_id>})
-- ARGV[1] run id
-- ARGV[2] shard count
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
  rcall('HSET', key, 'shards', ARGV[2], 'created_at', now, 'state', 'running')
  return {1, tonumber(ARGV[2]), now}
end

return main()
