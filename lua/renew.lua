-- renew: extend a lease; only its holder may (state leased, same token, same
-- lease id, not yet expired).
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1] item id (id)
-- ARGV[2] token (int, bound token)
-- ARGV[3] lease id, '' to check the token alone (id?)
-- ARGV[4] new TTL in ms, counted from now (int, bound ttl_ms)
-- ARGV[5] optional trace id of the attempt, logged with a refusal (id?), default ''
--
-- Log: a refusal (LEASE_LOST) only.
-- Returns: {expires_at ms, now ms}
-- Errors: INVALID <what>; NOT_FOUND item=<id>;
--   LEASE_LOST item=<id> token=<t> current_token=<t> state=<s> reason=<r> expires_at=<ms>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "holder.lua"

local function main()
  local bad = check_keys(LOGGED_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'token'}, {3, 'id?'}, {4, 'int', 'ttl_ms'},
    {5, 'id?', nil, ''}})
  if bad then return bad end
  local row, err = do_renew(A[1], A[2], A[3], A[4], now_ms(), A[5])
  if not row then return err end
  return {row[2], row[3]}
end

return flushed(main)
