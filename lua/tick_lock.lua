-- tick_lock: take the lock of one job's tick, fenced by the leader's token when a leader ticks.
-- Once a leader took the job's lock, a leader with an older token is refused it for good, and
-- a newer leader takes it at once, even from an older leader still holding it (paused or dead:
-- its lease of the leadership has ended, or the newer one would not hold it). A tick with no
-- leader (cron, rq-scheduler) gives no token: it takes the lock only when it is free.
--
-- KEYS[1] lock: string, the job's tick lock (its owner); <prefix>:job:{<job>}:tick
-- KEYS[2] fence: string, the newest leader token that took the lock; KEYS[1] followed by :fence
-- ARGV[1] the owner, new for each tick (id)
-- ARGV[2] optional leader's token, default none: a tick with no leader (int, bound token)
-- ARGV[3] the lock's time to live in ms (int, bound ttl_ms)
--
-- Returns: 1 taken: the token is newer than the fence (the lock is taken from whoever held it),
--   or the lock was free, or it already holds this owner (its time to live starts again); 0 held by another tick, when the
--   token is the fence's or none was given; -1 refused: a leader with a newer token has taken it
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'tick', 'string'}, {'tick:fence', 'string'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'token', 0}, {3, 'int', 'ttl_ms'}})
  if bad then return bad end
  local owner, token, ttl = A[1], A[2], A[3]
  if token > 0 then
    local fence = tonumber(rcall('GET', KEYS[2]) or '0') or 0
    if token < fence then return -1 end
    if token > fence then
      rcall('SET', KEYS[2], token)
      rcall('SET', KEYS[1], owner, 'PX', ttl)
      return 1
    end
  end
  if rcall('SET', KEYS[1], owner, 'NX', 'PX', ttl) then return 1 end
  if rcall('GET', KEYS[1]) == owner then
    rcall('PEXPIRE', KEYS[1], ttl)
    return 1
  end
  return 0
end

return main()
