-- reap: move up to N expired leases back to pending (due at once), or to dead
-- when their last attempt expired. For a sweep that does not claim.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] N, the most leases to reap
--
-- Returns: {moved to pending, moved to dead, now ms}
-- Errors: INVALID when the limit is not a number
-- @include "shard.lua"

local function main()
  local limit = tonumber(ARGV[1])
  local now = now_ms()
  local max_attempts = meta_number('max_attempts', 5)
  local to_pending, to_dead = 0, 0
  if not limit then return fail('INVALID', 'ARGV[1] must be a number') end
  for _, id in ipairs(rcall('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, limit)) do
    local rec = load(id)
    if not rec then  -- an index entry without a record: drop it, never wedge
      rcall('ZREM', LEASES, id)
      rcall('ZREM', HELD, id)
    else
      rec.expires_at = nil
      rec.updated_at = now
      bump('expired')
      if rec.attempts >= max_attempts then
        rec.error = 'lease expired on the last attempt'
        set_state(id, rec, 'dead', now)
        to_dead = to_dead + 1
      else
        set_state(id, rec, 'pending', now)
        to_pending = to_pending + 1
      end
      save(id, rec)
    end
  end
  return {to_pending, to_dead, now}
end

return main()
