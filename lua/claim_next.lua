-- claim_next: lease up to N due items of a shard in one call. Expired leases
-- come first (counted as takeovers), then pending items in eligible-at order.
-- No lease is granted once the shard is closed or its deadline has passed. One TIME,
-- one read of meta, one HMGET of the records and one multi-member write per index.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1] worker name (id)
-- ARGV[2] lease id base: each lease id is <base>.<n> (id); at most id_length - 6 characters,
--   so that every lease id granted is an id
-- ARGV[3] lease TTL in ms (int, bound ttl_ms)
-- ARGV[4] N, the most items to claim (int, bound batch)
--
-- Counters: lost (index entries whose record vanished, dropped).
-- Log: takeover for each expired lease taken over, dead for one that expired on its last attempt.
-- Returns: an array of claim rows, each
--   {item id, token, lease id, expires_at ms, attempt, payload, takeover 0|1, now ms}
--   (payload: the JSON text as added, '' when it was null); empty when nothing is due.
-- Errors: INVALID <what>; RUN_CLOSED run=<id> reason=closed|deadline deadline=<ms>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "shard_meta.lua"
-- @include "lease.lua"

-- `due` is the head of the due index (ranks 0 to #due - 1, read from -inf). When every one of
-- them, and nothing else, is staged to leave it (no entry was dropped meanwhile), one
-- ZREMRANGEBYRANK removes them instead of a ZREM of each.
local function remove_due_head(due)
  local staged = staged_z[DUE]
  if not staged or #due == 0 then return end
  local count = 0
  for _, score in pairs(staged) do
    if score ~= false then return end
    count = count + 1
  end
  if count ~= #due then return end
  for _, id in ipairs(due) do
    if staged[id] ~= false then return end
  end
  rcall('ZREMRANGEBYRANK', DUE, 0, #due - 1)
  staged_z[DUE], staged_order[DUE] = nil, nil
end

local function main()
  local bad = check_keys(LOGGED_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'id'}, {3, 'int', 'ttl_ms'}, {4, 'int', 'batch'}})
  if bad then return bad end
  local worker, base, ttl, limit = A[1], A[2], A[3], A[4]
  local longest = LIMITS.bounds.id_length[2] - 6  -- '.' and up to 5 digits of the batch
  if #base > longest then
    return fail('INVALID', 'ARGV[2] must be at most ' .. longest .. ' characters: lease ids are <base>.<n>')
  end
  local now = now_ms()
  bad = barred(now)
  if bad then return bad end
  local expired = rcall('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, limit)
  local due = rcall('ZRANGEBYSCORE', DUE, '-inf', now, 'LIMIT', 0, limit)
  local ids = {}
  for _, id in ipairs(expired) do ids[#ids + 1] = id end
  for _, id in ipairs(due) do ids[#ids + 1] = id end
  prefetch(ids)
  local rows = {}
  local function take(index, list)
    for _, id in ipairs(list) do
      if #rows >= limit then return end
      local rec = load(id)
      if not rec then
        drop_orphan(id)
      elseif rec.state == 'pending' or lease_expired(rec, now) then
        local row = grant(id, rec, worker, base .. '.' .. (#rows + 1), ttl, now)
        if row then rows[#rows + 1] = row end  -- nil: it went dead
      elseif INDEX[rec.state] ~= index then
        stage_z(index, id, false)  -- a stray entry: the record is in another state
      end
    end
  end
  take(LEASES, expired)
  take(DUE, due)
  if #rows > 0 then bump('claims', #rows) end
  remove_due_head(due)
  return rows
end

return flushed(main)
