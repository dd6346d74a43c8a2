-- slot_acquire: take one of a provider's concurrency slots, fleet-wide. A slot
-- is a lease too: it expires if its holder dies. No slot is granted while the
-- provider's throttle pause lasts.
--
-- KEYS[1] slots: zset, holder -> slot expiry (ms)
-- KEYS[2] state: hash (cap, min_cap, max_cap, paused_until, peak_in_use, counters)
-- ARGV[1] holder id
-- ARGV[2] slot TTL in ms
-- ARGV[3] max cap (set once), ARGV[4] min cap (set once)
--
-- Returns: {1, cap, in use} when granted; {0, cap, in use, wait ms} when not
-- Errors: INVALID when the TTL or a cap is not a number
local rcall = redis.call

local function main()
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  for i = 2, 4 do
    if not tonumber(ARGV[i]) then return redis.error_reply('INVALID ARGV[' .. i .. '] must be a number') end
  end
  rcall('HSETNX', KEYS[2], 'max_cap', ARGV[3])
  rcall('HSETNX', KEYS[2], 'min_cap', ARGV[4])
  rcall('HSETNX', KEYS[2], 'cap', ARGV[3])
  rcall('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  local cap = tonumber(rcall('HGET', KEYS[2], 'cap'))
  local used = rcall('ZCARD', KEYS[1])
  local paused = tonumber(rcall('HGET', KEYS[2], 'paused_until') or '0')
  if paused > now then
    rcall('HINCRBY', KEYS[2], 'waits', 1)
    return {0, cap, used, paused - now}
  end
  if rcall('ZSCORE', KEYS[1], ARGV[1]) == false and used >= cap then
    rcall('HINCRBY', KEYS[2], 'waits', 1)
    local first = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    return {0, cap, used, math.max(1, tonumber(first[2]) - now)}
  end
  rcall('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
  rcall('HINCRBY', KEYS[2], 'granted', 1)
  local in_use = rcall('ZCARD', KEYS[1])
  if in_use > tonumber(rcall('HGET', KEYS[2], 'peak_in_use') or '0') then
    rcall('HSET', KEYS[2], 'peak_in_use', in_use)
  end
  return {1, cap, in_use}
end

return main()
