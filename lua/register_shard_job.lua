-- register_shard_job: a shard job registers just before its work starts (its entry, and its
-- first heartbeat at the server's time), or unregisters when its pass is over. A job that is not
-- registered (taken over, or its entry lost) is left as it is by unregister.
--
-- KEYS[1] entries: hash, RQ job id -> the job's entry (JSON); <prefix>:{shard_jobs}
-- KEYS[2] beats: zset, RQ job id -> its last heartbeat (server ms); KEYS[1] followed by :beats
-- KEYS[3] taking: zset, RQ job id -> when its takeover began (ms); KEYS[1] followed by :taking
-- KEYS[4] clock: hash, the fleet's clock (include/fleet_clock.lua); KEYS[1] followed by :clock
-- ARGV[1] the RQ job id (id)
-- ARGV[2] what to do (one of register, unregister)
-- ARGV[3] the job's entry, JSON (json, bound json_bytes): with register; '' with unregister
-- ARGV[4] the stall gap in ms: a longer gap between calls is a stall (int, bound ttl_ms)
--
-- Returns: {was registered: 1 when the job was registered before the call, else 0; now ms}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "fleet_clock.lua"

local KEYS_TAKEN = {{'', 'hash'}, {'beats', 'zset'}, {'taking', 'zset'}, {'clock', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'one', {'register', 'unregister'}},
    {3, 'json', 'json_bytes', ''}, {4, 'int', 'ttl_ms'}})
  if bad then return bad end
  local id, what, entry, gap = A[1], A[2], A[3], A[4]
  if what == 'register' and entry == '' then
    return fail('INVALID', 'ARGV[3] must be the job\'s entry to register it')
  end
  local now = fleet_clock(KEYS[4], gap)
  local was = rcall('ZSCORE', KEYS[2], id) and 1 or 0
  if what == 'register' then
    rcall('HSET', KEYS[1], id, entry)
    rcall('ZADD', KEYS[2], now, id)
  elseif was == 1 then
    rcall('ZREM', KEYS[2], id)
    rcall('HDEL', KEYS[1], id)
  end
  return {was, now}
end

return main()
