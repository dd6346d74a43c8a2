-- slot_acquire: take one of a provider's concurrency slots, fleet-wide. A slot
-- is a lease too: it expires if its holder dies. No slot is granted while the
-- provider's throttle pause lasts.
--
-- KEYS[1] slots: zset, holder -> slot expiry (ms)
-- KEYS[2] state: hash, the provider's cap, min_cap, max_cap, paused_until, peak_in_use, counters
-- ARGV[1] holder id (id)
-- ARGV[2] slot TTL in ms (int, bound ttl_ms)
-- ARGV[3] max cap, set once (int, bound cap)
-- ARGV[4] min cap, set once (int, bound cap)
--
-- Returns: {1, cap, in use} when granted; {0, cap, in use, wait ms} when not
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'slots', 'zset'}, {'state', 'hash'}}

local function state_number(field, default)
  local n = tonumber(rcall('HGET', KEYS[2], field))
  if finite(n) then return n end
  return default
end

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'ttl_ms'}, {3, 'int', 'cap'}, {4, 'int', 'cap'}})
  if bad then return bad end
  if A[4] > A[3] then return fail('INVALID', 'min cap ' .. A[4] .. ' is over max cap ' .. A[3]) end
  local now = now_ms()
  rcall('HSETNX', KEYS[2], 'max_cap', A[3])
  rcall('HSETNX', KEYS[2], 'min_cap', A[4])
  rcall('HSETNX', KEYS[2], 'cap', A[3])
  rcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local cap = state_number('cap', A[3])
  local used = rcall('ZCARD', KEYS[1])
  local paused = state_number('paused_until', 0)
  if paused > now then
    rcall('HINCRBY', KEYS[2], 'waits', 1)
    return {0, cap, used, paused - now}
  end
  if rcall('ZSCORE', KEYS[1], A[1]) == false and used >= cap then
    rcall('HINCRBY', KEYS[2], 'waits', 1)
    local first = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, cap, used, math.max(1, tonumber(first[2]) - now)}
  end
  rcall('ZADD', KEYS[1], now + A[2], A[1])
  rcall('HINCRBY', KEYS[2], 'granted', 1)
  local in_use = rcall('ZCARD', KEYS[1])
  if in_use > state_number('peak_in_use', 0) then
    rcall('HSET', KEYS[2], 'peak_in_use', in_use)
  end
  return {1, cap, in_use}
end

return main()
