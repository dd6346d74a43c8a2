-- close_shard: close a shard to claims (when its run closes) or reopen it.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] '1' to close, '0' to reopen
--
-- Returns: 1 when the flag changed, 0 when it was already so
-- Errors: INVALID when the flag is neither '0' nor '1'
-- @include "shard.lua"

local function main()
  if ARGV[1] ~= '0' and ARGV[1] ~= '1' then return fail('INVALID', "ARGV[1] must be '0' or '1'") end
  local was = is_closed()
  local close = ARGV[1] == '1'
  if was == close then return 0 end
  rcall('HSET', META, 'closed', close and '1' or '0')
  return 1
end

return main()
