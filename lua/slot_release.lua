-- slot_release: give a provider slot back with the call's outcome, adapting
-- the cap: a throttle halves it (not below min_cap) and pauses new slots for
-- Retry-After; a full window of successes at the current cap raises it by one
-- (not above max_cap).
--
-- KEYS[1] slots: zset, holder -> slot expiry (ms)
-- KEYS[2] state: hash, the provider's cap, min_cap, max_cap, paused_until, counters
-- ARGV[1] holder id (id)
-- ARGV[2] outcome (one of ok|throttled|error)
-- ARGV[3] retry-after in ms, throttled only, clamped by the caller (int, bound delay_ms)
--
-- Returns: {cap after, 1 when the cap changed else 0}
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
  A, bad = check_args({{1, 'id'}, {2, 'one', {'ok', 'throttled', 'error'}}, {3, 'int', 'delay_ms', 0}})
  if bad then return bad end
  local now = now_ms()
  rcall('ZREM', KEYS[1], A[1])
  local cap = state_number('cap', 1)
  local min_cap = state_number('min_cap', 1)
  local max_cap = state_number('max_cap', cap)
  local new_cap = cap
  if A[2] == 'throttled' then
    new_cap = math.max(min_cap, math.floor(cap / 2))
    rcall('HINCRBY', KEYS[2], 'throttles', 1)
    rcall('HSET', KEYS[2], 'last_throttle_at', now, 'successes', 0)
    local until_ms = now + A[3]
    if until_ms > state_number('paused_until', 0) then rcall('HSET', KEYS[2], 'paused_until', until_ms) end
  elseif A[2] == 'ok' then
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
