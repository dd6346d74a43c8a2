-- tick_leader: the fleet's one ticking worker: hold (take or renew) the tick leader's lease, or
-- release it. The lease is one hash per key prefix: its holder's name, its fencing token and
-- its expiry on the server's clock. The token grows by one each time a new holder takes the
-- lease and never goes back; a holder that renews keeps its token. Another worker takes the
-- lease only once it has expired; a release frees it at once (the token stays).
--
-- KEYS[1] leader: hash, holder, token, expires (ms); <prefix>:{tick_leader}
-- ARGV[1] the worker's name (text, bound key_length)
-- ARGV[2] what to do (one of hold, release)
-- ARGV[3] the lease's time to live in ms (int, bound ttl_ms)
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
    {3, 'int', 'ttl_ms'}})
  if bad then return bad end
  local name, what, ttl = A[1], A[2], A[3]
  local now = now_ms()
  local stored = rcall('HMGET', KEYS[1], 'holder', 'token', 'expires')
  local holder = stored[1] or ''
  local token = tonumber(stored[2]) or 0
  local expires = tonumber(stored[3]) or 0
  local live = holder ~= '' and expires > now
  if what == 'release' then
    if holder == name then
      rcall('HSET', KEYS[1], 'holder', '', 'expires', 0)
      return {0, token, '', 0, now}
    end
    if live then return {0, token, holder, expires, now} end
    return {0, token, '', 0, now}
  end
  if live and holder ~= name then return {0, token, holder, expires, now} end
  if holder ~= name then token = token + 1 end
  rcall('HSET', KEYS[1], 'holder', name, 'token', token, 'expires', now + ttl)
  return {1, token, name, now + ttl, now}
end

return main()
