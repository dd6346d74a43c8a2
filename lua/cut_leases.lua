-- cut_leases: ends now every lease one owner holds in a shard, because its worker stopped
-- beating (killed, powered off, or paused past its heartbeat's life). Each lease's expiry
-- becomes now, so the next claim takes it over as it takes over any expired lease: a new
-- token, the attempt counted, dead after the last attempt. The old holder is refused from
-- now on, by the server clock, whatever its own clock says.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- ARGV[1] owner: the worker name its claims gave (id)
-- ARGV[2] N, the most leases to look at (int, bound sweep)
--
-- Counters: leases_cut (leases ended early), lost (index entries whose record vanished, dropped).
-- Returns: {leases cut, now ms}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"

local function main()
  local bad = check_keys(SHARD_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'sweep'}})
  if bad then return bad end
  local owner, limit = A[1], A[2]
  local now = now_ms()
  local ids = rcall('ZRANGEBYSCORE', LEASES, '(' .. now, '+inf', 'LIMIT', 0, limit)
  prefetch(ids)
  local cut = 0
  for _, id in ipairs(ids) do
    local rec = load(id)
    if not rec then
      drop_orphan(id)
    elseif rec.state == 'leased' and rec.owner == owner and not lease_expired(rec, now) then
      bad = put(id, rec, 'leased', now)
      if bad then return bad end
      cut = cut + 1
    end
  end
  if cut > 0 then bump('leases_cut', cut) end
  return {cut, now}
end

return flushed(main)
