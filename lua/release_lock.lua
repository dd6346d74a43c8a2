-- release_lock: delete a lock key only if it still holds the caller's token.
--
-- KEYS[1] the lock (string)
-- ARGV[1] the owner's token (id)
--
-- Returns: 1 when deleted, 0 when the lock was gone or held by another
-- Errors: INVALID <what>
-- @include "protocol.lua"

local function main()
  local bad = check_keys(1)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}})
  if bad then return bad end
  bad = check_key_types({'string'})
  if bad then return bad end
  if rcall('GET', KEYS[1]) == A[1] then
    return rcall('DEL', KEYS[1])
  end
  return 0
end

return main()
