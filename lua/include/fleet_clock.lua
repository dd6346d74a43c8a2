-- The fleet's clock, kept beside the shard job registry (a hash: last_ms, stall_end_ms,
-- stall_ms, stalls), and the one rule that judges a shard job dead.
--
-- Every worker checks the registry each second and every shard job sends a heartbeat
-- each second, each through a script that moves this clock on. A gap of more than the stall gap
-- between two of those calls, by the server's clock, means nobody reached Redis meanwhile:
-- it stalled (a fork, a long script, SIGSTOP), it failed over (the new primary's copy of
-- the clock is old, its own clock may differ), or every worker was cut off from it. The
-- call that sees the gap records its end. No job is judged dead until a full dead-after
-- period has passed since the last stall ended: every live job gets that long to send
-- a heartbeat again, and the time Redis was not serving is never counted against anyone.
-- @include "protocol.lua"

-- The clock is written at most every CLOCK_STEP_MS (the many heartbeats a second of a large
-- fleet write it a few times a second): a gap is then seen at most that much longer than
-- it was, so a pause a little shorter than the stall gap may count as a stall, which only
-- grants a grace. The stall gap is far longer.
local CLOCK_STEP_MS = 250

-- Moves the clock at `key` on to now; returns now and when the last stall ended (ms). A
-- clock never written, or one that went back (a failover to a server whose clock is
-- behind), counts as a stall that ends now.
local function fleet_clock(key, gap)
  local now = now_ms()
  local stored = rcall('HMGET', key, 'last_ms', 'stall_end_ms')
  local last, stall_end = tonumber(stored[1]), tonumber(stored[2])
  if not last or not stall_end or now - last > gap or now < last then
    rcall('HSET', key, 'last_ms', now, 'stall_end_ms', now,
      'stall_ms', last and math.abs(now - last) or 0)
    rcall('HINCRBY', key, 'stalls', 1)
    return now, now
  end
  if now - last >= CLOCK_STEP_MS then rcall('HSET', key, 'last_ms', now) end
  return now, stall_end
end

-- True when a job whose last heartbeat was at `beat_ms` is dead at `now`: none for more than
-- `dead_after` ms, and at least that long since the last stall ended.
local function beat_dead(beat_ms, now, stall_end, dead_after)
  return now - stall_end >= dead_after and beat_ms < now - dead_after
end
