-- release: the holder gives its item back unprocessed. It is due again at
-- once (or after a delay) and the attempt is not counted; the token is kept
-- (it never goes back).
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1] item id (id)
-- ARGV[2] token (int, bound token)
-- ARGV[3] lease id, '' to check the token alone (id?)
-- ARGV[4] optional delay in ms before the item is due again, default 0 (int, bound delay_ms)
-- ARGV[5] optional trace id of the attempt, logged (id?), default ''
--
-- Log: released, or a refusal (LEASE_LOST).
-- Returns: {now ms}
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
  A, bad = check_args({{1, 'id'}, {2, 'int', 'token'}, {3, 'id?'}, {4, 'int', 'delay_ms', 0},
    {5, 'id?', nil, ''}})
  if bad then return bad end
  local row, err = do_release(A[1], A[2], A[3], A[4], now_ms(), A[5])
  if not row then return err end
  return {row[2]}
end

return flushed(main)
