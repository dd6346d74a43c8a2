-- sweep_shard_jobs: a worker's check of the shard job registry, once a second. It returns
-- the jobs that are dead by the rule of include/fleet_clock.lua (no heartbeat for
-- dead-after ms, and that long since the last stall ended), the oldest first. It also
-- returns the takeovers begun that long ago and never finished (the worker died on the
-- way). It writes nothing but the fleet's clock. The worker takes over the jobs it
-- chooses with take_shard_jobs, which checks them again.
-- O(log n + found) whatever the number of registered jobs.
--
-- KEYS[1] entries: hash, RQ job id -> the job's entry (JSON); <prefix>:{shard_jobs}
-- KEYS[2] beats: zset, RQ job id -> its last heartbeat (server ms); KEYS[1] followed by :beats
-- KEYS[3] taking: zset, RQ job id -> when its takeover began (ms); KEYS[1] followed by :taking
-- KEYS[4] clock: hash, the fleet's clock (include/fleet_clock.lua); KEYS[1] followed by :clock
-- ARGV[1] dead after, ms (int, bound ttl_ms)
-- ARGV[2] the stall gap in ms (int, bound ttl_ms)
-- ARGV[3] the most jobs of each kind to return (int, bound batch)
-- ARGV[4] a takeover begun this many ms ago is offered again (int, bound ttl_ms)
--
-- Returns: {now ms, end of the last stall ms, dead, stuck}: dead and stuck each a flat
--   list of RQ job id, entry ('' when none), ms (its last heartbeat; when its takeover began)
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "fleet_clock.lua"

local KEYS_TAKEN = {{'', 'hash'}, {'beats', 'zset'}, {'taking', 'zset'}, {'clock', 'hash'}}

-- The members of zset `key` scored up to `score` (exclusive when `open`), with their
-- entries: a flat list of id, entry, score.
local function found(key, score, most)
  local page = rcall('ZRANGEBYSCORE', key, '-inf', score, 'WITHSCORES', 'LIMIT', 0, most)
  if #page == 0 then return {} end
  local ids = {}
  for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
  local entries = rcall('HMGET', KEYS[1], unpack(ids))
  local rows = {}
  for i, id in ipairs(ids) do
    rows[#rows + 1] = id
    rows[#rows + 1] = entries[i] or ''
    rows[#rows + 1] = tonumber(page[2 * i])
  end
  return rows
end

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'int', 'ttl_ms'}, {2, 'int', 'ttl_ms'}, {3, 'int', 'batch'},
    {4, 'int', 'ttl_ms'}})
  if bad then return bad end
  local dead_after, gap, most, retry = A[1], A[2], A[3], A[4]
  local now, stall_end = fleet_clock(KEYS[4], gap)
  local dead = {}
  if beat_dead(0, now, stall_end, dead_after) then
    dead = found(KEYS[2], '(' .. (now - dead_after), most)
  end
  return {now, stall_end, dead, found(KEYS[3], now - retry, most)}
end

return main()
