-- close_shard: close a shard to claims (when its run closes) or reopen it, set the
-- deadline after which no new lease is granted, and mark the shard's run as made again
-- after a loss of data (or as one that lived through it).
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- ARGV[1] '1' to close, '0' to reopen, '' to leave the flag (one of 1|0|'')
-- ARGV[2] optional new deadline in ms, 0 for none, '' to leave it (int, bound time_ms)
-- ARGV[3] '1' to mark the shard after_loss, '' to leave it (one of 1|''), default '': its
--   effect ledger may have been lost, so record_effect takes an effect with no record for
--   one that may have been applied. The mark stays for the run's life (never cleared)
--
-- Returns: 1 when the closed flag changed, 0 when it was already so (or left)
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"

local function main()
  local bad = check_keys(SHARD_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'one', {'1', '0', ''}}, {2, 'int', 'time_ms', false},
    {3, 'one', {'1', ''}, ''}})
  if bad then return bad end
  if A[2] then rcall('HSET', META, 'deadline_at', A[2]) end
  if A[3] == '1' then rcall('HSET', META, 'after_loss', '1') end
  if A[1] == '' then return 0 end
  local close = A[1] == '1'
  if (rcall('HGET', META, 'closed') == '1') == close then return 0 end
  rcall('HSET', META, 'closed', close and '1' or '0')
  return 1
end

return main()
