-- worker_beat: a worker process's heartbeat: its record, and the server's time of this
-- heartbeat (so every reader judges every worker by one clock). Workers silent longer than
-- the retention are forgotten, record and heartbeat, a few per call. Both keys expire a
-- retention after the last heartbeat of any worker.
--
-- KEYS[1] workers: hash, worker name -> its record (JSON); <prefix>:{workers}
-- KEYS[2] seen: zset, worker name -> its last heartbeat (ms); KEYS[1] followed by :seen
-- ARGV[1] worker name (text, bound key_length)
-- ARGV[2] the worker's record, JSON (json, bound json_bytes), '' to keep the one stored
-- ARGV[3] retention in ms: heartbeats older than this are forgotten (int, bound ttl_ms)
--
-- Returns: {now ms, workers forgotten}
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}, {'seen', 'zset'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'text', 'key_length'}, {2, 'json', 'json_bytes', ''},
    {3, 'int', 'ttl_ms'}})
  if bad then return bad end
  local name, record, retention = A[1], A[2], A[3]
  local now = now_ms()
  local old = rcall('ZRANGEBYSCORE', KEYS[2], '-inf', now - retention, 'LIMIT', 0, 100)
  if #old > 0 then
    rcall('ZREM', KEYS[2], unpack(old))
    rcall('HDEL', KEYS[1], unpack(old))
  end
  rcall('ZADD', KEYS[2], now, name)
  if record ~= '' then rcall('HSET', KEYS[1], name, record) end
  rcall('PEXPIRE', KEYS[2], retention)
  if rcall('EXISTS', KEYS[1]) == 1 then rcall('PEXPIRE', KEYS[1], retention) end
  return {now, #old}
end

return main()
