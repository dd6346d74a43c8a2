-- shard_job_beat: a registered shard job's heartbeat, stored at the server's time. Its lease
-- keeper sends one every second. A heartbeat of a job that is not registered (taken over,
-- ended, or its entry lost) registers nothing: the job learns that it is no longer
-- registered, and stops.
--
-- KEYS[1] beats: zset, RQ job id -> its last heartbeat (server ms); <prefix>:{shard_jobs}:beats
-- KEYS[2] clock: hash, the fleet's clock (include/fleet_clock.lua); <prefix>:{shard_jobs}:clock
-- ARGV[1] the RQ job id (id)
-- ARGV[2] the stall gap in ms: a longer gap between calls is a stall (int, bound ttl_ms)
--
-- Returns: {registered, now ms}: registered 1 when the job is registered (its
--   heartbeat stored), 0 when not (nothing changed)
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "fleet_clock.lua"

local KEYS_TAKEN = {{'beats', 'zset'}, {'clock', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'ttl_ms'}})
  if bad then return bad end
  local id, gap = A[1], A[2]
  local now = fleet_clock(KEYS[2], gap)
  if not rcall('ZSCORE', KEYS[1], id) then return {0, now} end
  rcall('ZADD', KEYS[1], now, id)
  return {1, now}
end

return main()
