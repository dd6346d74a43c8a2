-- claim_next: lease up to N due items of a shard in one call. Expired leases
-- come first (counted as takeovers), then pending items in eligible-at order.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] worker name
-- ARGV[2] lease id base: each lease id is <base>.<n>
-- ARGV[3] lease TTL in ms
-- ARGV[4] N, the most items to claim
--
-- Returns: an array of claim rows, each
--   {item id, token, lease id, expires_at ms, attempt, payload, takeover 0|1, now ms};
--   empty when nothing is due.
-- Errors: INVALID <what>; RUN_CLOSED
-- @include "shard.lua"

local function main()
  local worker, base, ttl, limit = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
  if not ttl or ttl < 1 or not limit or limit < 1 then
    return fail('INVALID', 'lease TTL and N must be numbers from 1')
  end
  if is_closed() then return fail('RUN_CLOSED', 'run=' .. (rcall('HGET', META, 'run') or '?')) end
  local now = now_ms()
  local rows = {}
  local function take(index)
    local ids = rcall('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, limit - #rows)
    for _, id in ipairs(ids) do
      local rec = load(id)
      if rec then
        local row = grant(id, rec, worker, base .. '.' .. (#rows + 1), ttl, now)
        if row then rows[#rows + 1] = row end
      else
        rcall('ZREM', index, id)  -- an index entry without a record: drop it, never wedge
      end
    end
  end
  take(LEASES)
  if #rows < limit then take(DUE) end
  if #rows > 0 then bump('claims', #rows) end
  return rows
end

return main()
