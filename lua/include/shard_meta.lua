-- The shard's settings (KEYS[1] meta), read once per call, and the rules made of them: the
-- bar on new leases (closed, or past the deadline) and the last attempt.
-- @include "protocol.lua"
-- @include "shard_keys.lua"

local meta_cache
local function meta_of()
  if not meta_cache then
    local v = rcall('HMGET', META, 'closed', 'deadline_at', 'max_attempts', 'backoff_base_ms',
      'backoff_cap_ms', 'run')
    meta_cache = {closed = v[1], deadline_at = v[2], max_attempts = v[3], backoff_base_ms = v[4],
      backoff_cap_ms = v[5], run = v[6]}
  end
  return meta_cache
end

local meta_numbers = {}
local function meta_number(field)
  local value = meta_numbers[field]
  if value then return value end
  value = tonumber(meta_of()[field])
  if not finite(value) then value = LIMITS.defaults[field] or 0 end
  meta_numbers[field] = value
  return value
end

local function run_name()
  return meta_of().run or '?'
end

-- The bar on new leases: the shard is closed, or its deadline has passed (server clock).
-- Returns nil, or the RUN_CLOSED error reply.
local function barred(now)
  local meta = meta_of()
  if meta.closed == '1' then
    return fail('RUN_CLOSED', 'run=' .. run_name() .. ' reason=closed deadline=0')
  end
  local deadline = tonumber(meta.deadline_at) or 0
  if finite(deadline) and deadline > 0 and now >= deadline then
    return fail('RUN_CLOSED', 'run=' .. run_name() .. ' reason=deadline deadline=' .. deadline)
  end
  return nil
end

-- The last attempt: an item that has been claimed max_attempts times.
local function out_of_attempts(rec)
  return (rec.attempts or 0) >= meta_number('max_attempts')
end
