-- tick_leader: the fleet's one ticking worker: hold (take or renew) the tick leader's lease, or
-- release it. The lease is one hash per key prefix: its holder, its fencing token and its
-- expiry on the server's clock. The holder is a worker process's own id (its name and an id
-- made when it started), so two processes of one name never share the lease. The token grows
-- by one each time a holder takes the lease anew (a new holder, or its last holder once it
-- expired) and never goes back; a holder that renews a live lease keeps its token. Another
-- worker takes the lease only once it has expired; a release frees it at once (the token
-- stays). A holder whose tick met a job fence ahead of its token (the lease's hash was lost:
-- deleted, evicted, or a failover dropped a write) asks for a token of at least the fence's
-- next, and gets it while its lease is live. Beside the lease the holder keeps what it says
-- of the jobs other workers declared (declare_jobs.lua) that it does not tick: a new holder
-- starts with none, a release drops it.
--
-- KEYS[1] leader: hash, holder, token, expires (ms), since (ms: when this holder took it anew), unticked; <prefix>:{tick_leader}
-- ARGV[1] the holder, the worker process's id (text, bound key_length)
-- ARGV[2] what to do (one of hold, release)
-- ARGV[3] the lease's time to live in ms (int, bound ttl_ms)
-- ARGV[4] the least token a hold may give, 1 for none (int, bound token)
-- ARGV[5] on a hold, the declared jobs the holder does not tick, JSON (json, bound json_bytes), '' to keep what it said before (optional)
--
-- Returns: {held, token, holder, expires ms, now ms}: held 1 when the caller holds the lease
--   now (token is its own, expires its new expiry); else 0 with the token, holder and expiry
--   of the live lease of another ('' and 0 when none holds it, e.g. after a release)
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'text', 'key_length'}, {2, 'one', {'hold', 'release'}},
    {3, 'int', 'ttl_ms'}, {4, 'int', 'token'}, {5, 'json', 'json_bytes', ''}})
  if bad then return bad end
  local name, what, ttl, at_least, unticked = A[1], A[2], A[3], A[4], A[5]
  local now = now_ms()
  local stored = rcall('HMGET', KEYS[1], 'holder', 'token', 'expires')
  local holder = stored[1] or ''
  local token = tonumber(stored[2]) or 0
  local expires = tonumber(stored[3]) or 0
  local live = holder ~= '' and expires > now
  if what == 'release' then
    if holder == name then
      rcall('HSET', KEYS[1], 'holder', '', 'expires', 0)
      rcall('HDEL', KEYS[1], 'unticked', 'since')
      return {0, token, '', 0, now}
    end
    if live then return {0, token, holder, expires, now} end
    return {0, token, '', 0, now}
  end
  if live and holder ~= name then return {0, token, holder, expires, now} end
  local anew = holder ~= name or not live
  if anew then token = token + 1 end
  if token < at_least then token = at_least end
  rcall('HSET', KEYS[1], 'holder', name, 'token', token, 'expires', now + ttl)
  if anew then rcall('HSET', KEYS[1], 'since', now) end
  if unticked ~= '' then
    rcall('HSET', KEYS[1], 'unticked', unticked)
  elseif anew then
    rcall('HDEL', KEYS[1], 'unticked')
  end
  return {1, token, name, now + ttl, now}
end

return main()
