-- fail: the holder reports a failed attempt. The item is retried after an
-- exponential backoff with jitter unless it was its last attempt, else it goes
-- dead; a permanent failure goes dead at once. The error text is kept with the item's
-- last errors (include/item_errors.lua).
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1] item id (id)
-- ARGV[2] token (int, bound token)
-- ARGV[3] lease id, '' to check the token alone (id?)
-- ARGV[4] error text (text, bound error_bytes)
-- ARGV[5] '1' for a permanent failure, else '0' (one of 1|0)
-- ARGV[6] jitter: the delay is backoff * (0.5 + jitter / 2) (num, bound jitter)
-- ARGV[7] optional trace id of the attempt, logged and kept with the error (id?), default ''
--
-- Log: retry or dead, or a refusal (LEASE_LOST).
-- Returns: {'retry' | 'dead', eligible_at ms (0 when dead), attempts, now ms}
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
  A, bad = check_args({{1, 'id'}, {2, 'int', 'token'}, {3, 'id?'}, {4, 'text', 'error_bytes'},
    {5, 'one', {'1', '0'}}, {6, 'num', 'jitter'}, {7, 'id?', nil, ''}})
  if bad then return bad end
  local row, err = do_fail(A[1], A[2], A[3], A[4], A[5] == '1', A[6], now_ms(), A[7])
  return row or err
end

return flushed(main)
