-- claim_next: lease up to N due items of a shard in one call. Expired leases
-- come first (counted as takeovers), then pending items in eligible-at order.
-- No lease is granted once the shard is closed or its deadline has passed.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] worker name (id)
-- ARGV[2] lease id base: each lease id is <base>.<n> (id)
-- ARGV[3] lease TTL in ms (int, bound ttl_ms)
-- ARGV[4] N, the most items to claim (int, bound batch)
--
-- Counters: lost (index entries whose record vanished, dropped).
-- Returns: an array of claim rows, each
--   {item id, token, lease id, expires_at ms, attempt, payload, takeover 0|1, now ms};
--   empty when nothing is due.
-- Errors: INVALID <what>; RUN_CLOSED run=<id> reason=closed|deadline deadline=<ms>
-- @include "shard.lua"

local function main()
  local bad = check_keys(7, false, SHARD_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'id'}, {3, 'int', 'ttl_ms'}, {4, 'int', 'batch'}})
  if bad then return bad end
  local worker, base, ttl, limit = A[1], A[2], A[3], A[4]
  local now = now_ms()
  bad = barred(now)
  if bad then return bad end
  local rows = {}
  local function take(index)
    local ids = rcall('ZRANGEBYSCORE', index, '-inf', now, 'LIMIT', 0, limit - #rows)
    for _, id in ipairs(ids) do
      local rec = load(id)
      if not rec then
        drop_orphan(id)
      elseif rec.state == 'pending' or lease_expired(rec, now) then
        local row = grant(id, rec, worker, base .. '.' .. (#rows + 1), ttl, now)
        if row then rows[#rows + 1] = row end  -- nil: it went dead, or it is left as it was
      elseif INDEX[rec.state] ~= index then
        rcall('ZREM', index, id)  -- a stray entry: the record is in another state
      end
    end
  end
  take(LEASES)
  if #rows < limit then take(DUE) end
  if #rows > 0 then bump('claims', #rows) end
  return rows
end

return main()
