-- claim: lease one named item that is pending and due, or leased with an
-- expired lease (a takeover). The token goes up by one on every claim.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] item id
-- ARGV[2] worker name
-- ARGV[3] new lease id
-- ARGV[4] lease TTL in ms
--
-- Returns: {item id, token, lease id, expires_at ms, attempt, payload, takeover 0|1, now ms}
-- Errors: INVALID <what>; RUN_CLOSED; NOT_FOUND item=<id>;
--   NOT_CLAIMABLE item=<id> state=<state> until=<ms> (until: lease expiry or eligible-at)
-- @include "shard.lua"

local function main()
  local id, worker, lease_id, ttl = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
  if not ttl or ttl < 1 then return fail('INVALID', 'lease TTL must be a number of ms from 1') end
  if is_closed() then return fail('RUN_CLOSED', 'run=' .. (rcall('HGET', META, 'run') or '?')) end
  local rec = load(id)
  if not rec then return fail('NOT_FOUND', 'item=' .. id) end
  local now = now_ms()
  local until_ms
  if rec.state == 'leased' then
    if rec.expires_at > now then until_ms = rec.expires_at end
  elseif rec.state == 'pending' then
    local eligible = tonumber(rcall('ZSCORE', DUE, id))
    if eligible > now then until_ms = eligible end
  else
    return fail('NOT_CLAIMABLE', 'item=' .. id .. ' state=' .. rec.state .. ' until=0')
  end
  if until_ms then
    return fail('NOT_CLAIMABLE', 'item=' .. id .. ' state=' .. rec.state .. ' until=' .. until_ms)
  end
  local row = grant(id, rec, worker, lease_id, ttl, now)
  if not row then return fail('NOT_CLAIMABLE', 'item=' .. id .. ' state=dead until=0') end
  bump('claims')
  return row
end

return main()
