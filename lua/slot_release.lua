-- slot_release: give a provider slot back with the call's outcome, adapting
-- the cap: a throttle halves it (not below min_cap) and pauses new slots for
-- Retry-After; a full window of successes at the current cap raises it by one
-- (not above max_cap).
--
-- KEYS[1] slots: zset, holder -> slot expiry (ms)
-- KEYS[2] state: hash (cap, min_cap, max_cap, paused_until, counters)
-- ARGV[1] holder id
-- ARGV[2] outcome: ok | throttled | error
-- ARGV[3] retry-after in ms (throttled only)
--
-- Returns: {cap after, 1 when the cap changed else 0}
local rcall = redis.call

local function main()
  local t = rcall('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  rcall('ZREM', KEYS[1], ARGV[1])
  local cap = tonumber(rcall('HGET', KEYS[2], 'cap') or '1')
  local min_cap = tonumber(rcall('HGET', KEYS[2], 'min_cap') or '1')
  local max_cap = tonumber(rcall('HGET', KEYS[2], 'max_cap') or tostring(cap))
  local new_cap = cap
  if ARGV[2] == 'throttled' then
    new_cap = math.max(min_cap, math.floor(cap / 2))
    rcall('HINCRBY', KEYS[2], 'throttles', 1)
    rcall('HSET', KEYS[2], 'last_throttle_at', now, 'successes', 0)
    local until_ms = now + math.max(0, tonumber(ARGV[3]) or 0)
    local paused = tonumber(rcall('HGET', KEYS[2], 'paused_until') or '0')
    if until_ms > paused then rcall('HSET', KEYS[2], 'paused_until', until_ms) end
  elseif ARGV[2] == 'ok' then
    local streak = rcall('HINCRBY', KEYS[2], 'successes', 1)
    if streak >= cap and cap < max_cap then
      new_cap = cap + 1
      rcall('HSET', KEYS[2], 'successes', 0)
    end
  end
  if new_cap ~= cap then
    rcall('HSET', KEYS[2], 'cap', new_cap)
    rcall('HINCRBY', KEYS[2], 'cap_changes', 1)
  end
  return {new_cap, new_cap ~= cap and 1 or 0}
end

return main()
