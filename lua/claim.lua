-- claim: lease one named item that is pending and due, or leased with an
-- expired lease (a takeover, logged as the end of the expired attempt). The token goes
-- up by one on every claim. No lease is granted once the shard is closed or its deadline
-- has passed.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1] item id (id)
-- ARGV[2] worker name (id)
-- ARGV[3] new lease id (id)
-- ARGV[4] lease TTL in ms (int, bound ttl_ms)
--
-- Returns: {item id, token, lease id, expires_at ms, attempt, payload, takeover 0|1, now ms}
--   (payload: the JSON text as added, '' when it was null)
-- Errors: INVALID <what>; RUN_CLOSED run=<id> reason=closed|deadline deadline=<ms>;
--   NOT_FOUND item=<id>;
--   NOT_CLAIMABLE item=<id> state=<state> until=<ms> (until: lease expiry or eligible-at)
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "shard_meta.lua"
-- @include "lease.lua"

local function main()
  local bad = check_keys(LOGGED_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'id'}, {3, 'id'}, {4, 'int', 'ttl_ms'}})
  if bad then return bad end
  local id = A[1]
  local now = now_ms()
  bad = barred(now)
  if bad then return bad end
  local rec = load(id)
  if not rec then return fail('NOT_FOUND', 'item=' .. id) end
  local until_ms
  if rec.state == 'leased' then
    if not lease_expired(rec, now) then until_ms = rec.expires_at end
  elseif rec.state == 'pending' then
    local eligible = tonumber(rcall('ZSCORE', DUE, id)) or now
    if eligible > now then until_ms = eligible end
  else
    return fail('NOT_CLAIMABLE', 'item=' .. id .. ' state=' .. rec.state .. ' until=0')
  end
  if until_ms then
    return fail('NOT_CLAIMABLE', 'item=' .. id .. ' state=' .. rec.state .. ' until=' .. until_ms)
  end
  local row, err = grant(id, rec, A[2], A[3], A[4], now)
  if err then return err end
  if row then bump('claims') end
  if not row then return fail('NOT_CLAIMABLE', 'item=' .. id .. ' state=dead until=0') end
  return row
end

return flushed(main)
