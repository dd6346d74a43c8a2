-- renew: extend a lease; only its holder may (state leased, same token, same
-- lease id, not yet expired).
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] item id
-- ARGV[2] token
-- ARGV[3] lease id ('' to check the token alone)
-- ARGV[4] new TTL in ms, counted from now
--
-- Returns: {expires_at ms, now ms}
-- Errors: INVALID <what>; NOT_FOUND item=<id>; LEASE_LOST item=<id> token=<t> current_token=<t> state=<s>
-- @include "shard.lua"

local function main()
  local id, token, lease_id, ttl = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
  if not ttl or ttl < 1 then return fail('INVALID', 'lease TTL must be a number of ms from 1') end
  local now = now_ms()
  local rec, err = held(id, token, lease_id, now)
  if not rec then return err end
  rec.expires_at = now + ttl
  rec.updated_at = now
  rcall('ZADD', LEASES, rec.expires_at, id)
  save(id, rec)
  bump('renewals')
  return {rec.expires_at, now}
end

return main()
