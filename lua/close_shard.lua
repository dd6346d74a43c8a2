-- close_shard: close a shard to claims (when its run closes) or reopen it.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] '1' to close, '0' to reopen
--
-- Returns: 1 when the flag changed, 0 when it was already so
-- @include "shard.lua"

local function main()
  local was = is_closed()
  local close = ARGV[1] == '1'
  if was == close then return 0 end
  rcall('HSET', META, 'closed', close and '1' or '0')
  return 1
end

return main()
