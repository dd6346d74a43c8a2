-- release_lock: delete a lock key only if it still holds the caller's token.
--
-- KEYS[1] the lock (string)
-- ARGV[1] the owner's token
--
-- Returns: 1 when deleted, 0 when the lock was gone or held by another
local rcall = redis.call

if rcall('GET', KEYS[1]) == ARGV[1] then
  return rcall('DEL', KEYS[1])
end
return 0
