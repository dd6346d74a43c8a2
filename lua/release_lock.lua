-- release_lock: delete a lock key only if it still holds the caller's token.
--
-- KEYS[1] lock: string, the lock (any key)
-- ARGV[1] the owner's token (id)
--
-- Returns: 1 when deleted, 0 when the lock was gone or held by another
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{false, 'string'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}})
  if bad then return bad end
  if rcall('GET', KEYS[1]) == A[1] then
    return rcall('DEL', KEYS[1])
  end
  return 0
end

return main()
