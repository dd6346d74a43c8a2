-- Shared prelude of every shard script, expanded where a script says
-- `-- @include "shard.lua"`. It names the seven shard keys and holds the one
-- definition of each state rule: an item's move between states and indexes,
-- lease expiry, the last attempt, the deadline, and the holder check.
--
-- Shard keys (all share the hash tag {<run_id>#<shard>}):
--   KEYS[1] meta     hash: run, shard, max_attempts, backoff_base_ms, backoff_cap_ms,
--                    deadline_at (ms, 0 = none), closed
--   KEYS[2] counts   hash: done and the event counters (pending, leased, dead: ZCARD of due,
--                    leases, dead); added, lost and late_commits keep a run's accounting
--   KEYS[3] items    hash: item id -> JSON record
--   KEYS[4] due      zset: pending items by eligible-at (ms)
--   KEYS[5] leases   zset: leased items by lease expiry (ms)
--   KEYS[6] held     zset: leased items by lease start (ms)
--   KEYS[7] dead     zset: dead items by time of death (ms)
-- @include "protocol.lua"
local META, COUNTS, ITEMS, DUE, LEASES, HELD, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local INDEX = {pending = DUE, leased = LEASES, dead = DEAD}
local SHARD_KEYS = {'meta', 'counts', 'items', 'due', 'leases', 'held', 'dead'}

local function load(id)
  local raw = rcall('HGET', ITEMS, id)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function bump(counter, by)
  rcall('HINCRBY', COUNTS, counter, by or 1)
end

local function meta_number(field)
  local value = tonumber(rcall('HGET', META, field))
  if finite(value) then return value end
  return LIMITS.defaults[field] or 0
end

local function run_name()
  return rcall('HGET', META, 'run') or '?'
end

-- The bar on new leases: the shard is closed, or its deadline has passed (server clock).
-- Returns nil, or the RUN_CLOSED error reply.
local function barred(now)
  local flags = rcall('HMGET', META, 'closed', 'deadline_at')
  if flags[1] == '1' then
    return fail('RUN_CLOSED', 'run=' .. run_name() .. ' reason=closed deadline=0')
  end
  local deadline = tonumber(flags[2]) or 0
  if finite(deadline) and deadline > 0 and now >= deadline then
    return fail('RUN_CLOSED', 'run=' .. run_name() .. ' reason=deadline deadline=' .. deadline)
  end
  return nil
end

-- Lease expiry: the record's expires_at, written only by put() together with
-- the leases index score, read only here.
local function lease_expired(rec, now)
  return rec.state == 'leased' and rec.expires_at <= now
end

-- The last attempt: an item that has been claimed max_attempts times.
local function out_of_attempts(rec)
  return (rec.attempts or 0) >= meta_number('max_attempts')
end

-- Stores `rec` in `state`: the record with its new state first encoded and its
-- size checked (before any write), then the indexes moved and the record saved.
-- pending, leased and dead are counted by their indexes (ZCARD), done by the
-- `done` counter. `score` is the index score: eligible-at for pending, time of
-- death for dead, lease expiry for leased (the lease start is rec.leased_at).
-- Returns nil, or an INVALID error reply when nothing was written.
local function put(id, rec, state, score)
  local old = rec.state
  if state ~= 'done' and not finite(score) then return fail('INVALID', 'index score for ' .. id) end
  if state == 'leased' then rec.expires_at = score else rec.expires_at = nil end
  rec.state = state
  local text = cjson.encode(rec)
  if #text > LIMITS.bounds.record_bytes[2] then
    rec.state = old
    return fail('INVALID', 'item record ' .. id .. ' would be ' .. #text .. ' bytes, over '
      .. LIMITS.bounds.record_bytes[2])
  end
  if INDEX[old] then rcall('ZREM', INDEX[old], id) end
  if old == 'leased' then rcall('ZREM', HELD, id) end
  if state == 'done' and old ~= 'done' then bump('done') end
  if INDEX[state] then rcall('ZADD', INDEX[state], score, id) end
  if state == 'leased' then rcall('ZADD', HELD, rec.leased_at, id) end
  rcall('HSET', ITEMS, id, text)
  return nil
end

-- An index entry whose record vanished (evicted, deleted): dropped, never
-- wedging the shard, and counted as lost.
local function drop_orphan(id)
  local removed = 0
  for _, index in pairs(INDEX) do removed = removed + rcall('ZREM', index, id) end
  rcall('ZREM', HELD, id)
  if removed > 0 then bump('lost') end
end

-- An expired lease ends its attempt: dead after the last attempt, else the
-- caller takes it over or makes it pending. Returns true when it went dead.
local function expire_lease(id, rec, now)
  if not out_of_attempts(rec) then
    bump('expired')
    return false
  end
  rec.error = 'lease expired on the last attempt'
  rec.updated_at = now
  if not put(id, rec, 'dead', now) then bump('expired') end
  return true
end

-- The plain-words reason a holder check refused: state, token, lease or expired.
local function lost_reason(rec, token, lease_id, now)
  if rec.state ~= 'leased' then return 'state' end
  if rec.token ~= token then return 'token' end
  if lease_id ~= '' and rec.lease_id ~= lease_id then return 'lease' end
  return 'expired'
end

-- The holder check shared by renew, commit, fail, release and effects.
-- Returns the record, or nil and the error reply. A refusal is counted in
-- stale_refused and, when given, in the counter `refused` (e.g. stale_commits).
-- `loaded` is the item's record when the caller has read it already.
local function held(id, token, lease_id, now, refused, loaded)
  local rec = loaded or load(id)
  if not rec then return nil, fail('NOT_FOUND', 'item=' .. id) end
  if rec.state == 'leased' and rec.token == token and (lease_id == '' or rec.lease_id == lease_id)
      and not lease_expired(rec, now) then
    return rec
  end
  bump('stale_refused')
  if refused then bump(refused) end
  return nil, fail('LEASE_LOST', 'item=' .. id .. ' token=' .. token .. ' current_token=' .. (rec.token or 0)
    .. ' state=' .. rec.state .. ' reason=' .. lost_reason(rec, token, lease_id, now)
    .. ' expires_at=' .. (rec.expires_at or 0))
end

-- Grants a new lease on `rec` (pending and due, or leased with an expired lease).
-- The caller has checked the bar and counts the claims it granted.
-- Returns the claim reply row; an expired lease on its last attempt goes dead
-- instead and the function returns nil; nil and an error reply when the record
-- cannot be stored (nothing of it was written).
local function grant(id, rec, worker, lease_id, ttl, now)
  local takeover = rec.state == 'leased'
  if takeover then
    if expire_lease(id, rec, now) then return nil end
    bump('takeovers')
  end
  rec.token = (rec.token or 0) + 1
  rec.lease_id = lease_id
  rec.owner = worker
  rec.attempts = (rec.attempts or 0) + 1
  rec.leased_at = now
  rec.updated_at = now
  local err = put(id, rec, 'leased', now + ttl)
  if err then return nil, err end
  return {id, rec.token, lease_id, rec.expires_at, rec.attempts, rec.payload or '', takeover and 1 or 0, now}
end
