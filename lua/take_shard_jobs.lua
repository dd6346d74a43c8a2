-- take_shard_jobs: a worker takes over shard jobs (take), or says it has finished taking
-- them over (done). Take checks each job again, by the rule of include/fleet_clock.lua. It
-- moves each dead one from the heartbeats to the takeovers begun, so that one worker wins
-- it. A takeover begun long ago and never finished is taken again. Take_dead takes each
-- registered job whatever its heartbeats say: its process is known to be gone (RQ saw its
-- work horse die). Done forgets the job.
--
-- KEYS[1] entries: hash, RQ job id -> the job's entry (JSON); <prefix>:{shard_jobs}
-- KEYS[2] beats: zset, RQ job id -> its last heartbeat (server ms); KEYS[1] followed by :beats
-- KEYS[3] taking: zset, RQ job id -> when its takeover began (ms); KEYS[1] followed by :taking
-- KEYS[4] clock: hash, the fleet's clock (include/fleet_clock.lua); KEYS[1] followed by :clock
-- ARGV[1] what to do (one of take, take_dead, done)
-- ARGV[2] dead after, ms (int, bound ttl_ms)
-- ARGV[3] the stall gap in ms (int, bound ttl_ms)
-- ARGV[4] a takeover begun this many ms ago is taken again (int, bound ttl_ms)
-- ARGV[5...] RQ job ids (id); at most batch ids
--
-- Returns: {now ms, the ids taken (take) or forgotten (done)}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "fleet_clock.lua"

local KEYS_TAKEN = {{'', 'hash'}, {'beats', 'zset'}, {'taking', 'zset'}, {'clock', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A, ids
  A, bad = check_args({{1, 'one', {'take', 'take_dead', 'done'}}, {2, 'int', 'ttl_ms'},
    {3, 'int', 'ttl_ms'}, {4, 'int', 'ttl_ms'}})
  if bad then return bad end
  ids, bad = check_rest(5, {{'id'}}, 'batch')
  if bad then return bad end
  local what, dead_after, gap, retry = A[1], A[2], A[3], A[4]
  local now, stall_end = fleet_clock(KEYS[4], gap)
  local done = {}
  for _, group in ipairs(ids) do
    local id = group[1]
    if what == 'done' then
      local was = rcall('ZREM', KEYS[3], id)
      if was == 1 then
        rcall('HDEL', KEYS[1], id)
        done[#done + 1] = id
      end
    else
      local beat = tonumber(rcall('ZSCORE', KEYS[2], id))
      local began = tonumber(rcall('ZSCORE', KEYS[3], id))
      if (beat and (what == 'take_dead' or beat_dead(beat, now, stall_end, dead_after)))
          or (not beat and began and began <= now - retry) then
        if beat then rcall('ZREM', KEYS[2], id) end
        rcall('ZADD', KEYS[3], now, id)
        done[#done + 1] = id
      end
    end
  end
  return {now, done}
end

return main()
