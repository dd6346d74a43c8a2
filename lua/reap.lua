-- reap: move up to N expired leases back to pending (due at once), or to dead
-- when their last attempt expired. For a sweep that does not claim.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1] N, the most leases to reap (int, bound sweep)
--
-- Counters: expired, lost (index entries whose record vanished, dropped).
-- Log: expired for each lease moved to pending, dead for each moved to dead.
-- Returns: {moved to pending, moved to dead, now ms}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "lease.lua"

local function main()
  local bad = check_keys(LOGGED_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'int', 'sweep'}})
  if bad then return bad end
  local now = now_ms()
  local to_pending, to_dead = 0, 0
  local ids = rcall('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, A[1])
  prefetch(ids)
  for _, id in ipairs(ids) do
    local rec = load(id)
    if not rec then
      drop_orphan(id)
    elseif rec.state ~= 'leased' then
      stage_z(LEASES, id, false)  -- a stray entry: the record is in another state
      stage_z(HELD, id, false)
    elseif not lease_expired(rec, now) then
      stage_z(LEASES, id, rec.expires_at)  -- the record's expiry is the truth
    elseif expire_lease(id, rec, now, 'expired') then
      to_dead = to_dead + 1
    else
      if not put(id, rec, 'pending', now) then to_pending = to_pending + 1 end
    end
  end
  return {to_pending, to_dead, now}
end

return flushed(main)
