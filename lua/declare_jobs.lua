-- declare_jobs: a worker given jobs to tick (redis-lease worker --job) says which, so that the
-- tick leader ticks them too or names the ones it cannot tick; or it withdraws what it said
-- when it stops. Each declaration is kept under the worker process's id with the server's time
-- of its last renewal; declarations not renewed within the retention are dropped, a few per
-- call, and both keys expire a retention after the last declaration. What a declaration holds
-- is only read, never run: the leader looks its paths up in the code it has loaded.
--
-- KEYS[1] declared: hash, process id -> its declaration (JSON); <prefix>:{tick_leader}:declared
-- KEYS[2] seen: zset, process id -> its last declaration (ms); KEYS[1] followed by :seen
-- ARGV[1] the worker process's id (text, bound key_length)
-- ARGV[2] its declaration, JSON: {"worker": name, "jobs": {job: path}} (json, bound json_bytes), '' to withdraw it
-- ARGV[3] retention in ms: declarations older than this are dropped (int, bound ttl_ms)
--
-- Returns: {now ms, declarations dropped}
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'declared', 'hash'}, {'declared:seen', 'zset'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'text', 'key_length'}, {2, 'json', 'json_bytes', ''},
    {3, 'int', 'ttl_ms'}})
  if bad then return bad end
  local id, declaration, retention = A[1], A[2], A[3]
  local now = now_ms()
  local old = rcall('ZRANGEBYSCORE', KEYS[2], '-inf', now - retention, 'LIMIT', 0, 100)
  if #old > 0 then
    rcall('ZREM', KEYS[2], unpack(old))
    rcall('HDEL', KEYS[1], unpack(old))
  end
  if declaration == '' then
    rcall('ZREM', KEYS[2], id)
    rcall('HDEL', KEYS[1], id)
  else
    rcall('ZADD', KEYS[2], now, id)
    rcall('HSET', KEYS[1], id, declaration)
  end
  if rcall('EXISTS', KEYS[2]) == 1 then rcall('PEXPIRE', KEYS[2], retention) end
  if rcall('EXISTS', KEYS[1]) == 1 then rcall('PEXPIRE', KEYS[1], retention) end
  return {now, #old}
end

return main()
