-- Shared prelude of every shard script, expanded where a script says
-- `-- @include "shard.lua"`. It names the seven shard keys, reads the server
-- clock and keeps item records, counters and indexes in step.
--
-- Shard keys (all share the hash tag {<run_id>#<shard>}):
--   KEYS[1] meta     hash: run, shard, max_attempts, backoff_base_ms, backoff_cap_ms, closed
--   KEYS[2] counts   hash: done and the event counters (pending, leased, dead: ZCARD of due, leases, dead)
--   KEYS[3] items    hash: item id -> JSON record
--   KEYS[4] due      zset: pending items by eligible-at (ms)
--   KEYS[5] leases   zset: leased items by lease expiry (ms)
--   KEYS[6] held     zset: leased items by lease start (ms)
--   KEYS[7] dead     zset: dead items by time of death (ms)
local rcall = redis.call
local META, COUNTS, ITEMS, DUE, LEASES, HELD, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]

-- Milliseconds on the server clock: the only clock that decides lease expiry.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fail(code, detail)
  return redis.error_reply(code .. ' ' .. detail)
end

local function load(id)
  local raw = rcall('HGET', ITEMS, id)
  if not raw then return nil end
  return cjson.decode(raw)
end

local function save(id, rec)
  rcall('HSET', ITEMS, id, cjson.encode(rec))
end

local function bump(counter, by)
  rcall('HINCRBY', COUNTS, counter, by or 1)
end

local function is_closed()
  return rcall('HGET', META, 'closed') == '1'
end

local function meta_number(field, default)
  return tonumber(rcall('HGET', META, field)) or default
end

-- Moves an item to `state`, keeping the indexes in step: pending, leased and
-- dead are counted by their indexes (ZCARD), done by the `done` counter. `score` is
-- the index score: eligible-at for pending, time of death for dead, lease
-- expiry for leased (the lease start is rec.leased_at).
local function set_state(id, rec, state, score)
  local old = rec.state
  if old == 'pending' then rcall('ZREM', DUE, id)
  elseif old == 'leased' then rcall('ZREM', LEASES, id); rcall('ZREM', HELD, id)
  elseif old == 'dead' then rcall('ZREM', DEAD, id) end
  if state == 'done' and old ~= 'done' then bump('done') end
  rec.state = state
  if state == 'pending' then rcall('ZADD', DUE, score, id)
  elseif state == 'leased' then rcall('ZADD', LEASES, score, id); rcall('ZADD', HELD, rec.leased_at, id)
  elseif state == 'dead' then rcall('ZADD', DEAD, score, id) end
end

-- The holder check shared by renew, commit, fail, release and effects.
-- Returns the record, or nil and the error reply. A refusal is counted in
-- stale_refused and, when given, in the counter `refused` (e.g. stale_commits).
-- `loaded` is the item's record when the caller has read it already.
local function held(id, token, lease_id, now, refused, loaded)
  if not token then return nil, fail('INVALID', 'token must be a number') end
  local rec = loaded or load(id)
  if not rec then return nil, fail('NOT_FOUND', 'item=' .. id) end
  if rec.state ~= 'leased' or rec.token ~= token or (lease_id ~= '' and rec.lease_id ~= lease_id)
      or rec.expires_at <= now then
    bump('stale_refused')
    if refused then bump(refused) end
    return nil, fail('LEASE_LOST', 'item=' .. id .. ' token=' .. token .. ' current_token=' .. (rec.token or 0)
      .. ' state=' .. rec.state)
  end
  return rec
end

-- Grants a new lease on `rec` (pending and due, or leased with an expired lease).
-- The caller counts the claims it granted.
-- Returns the claim reply row; an expired lease on its last attempt goes dead
-- instead and the function returns nil.
local function grant(id, rec, worker, lease_id, ttl, now)
  local takeover = rec.state == 'leased'
  if takeover then
    bump('expired')
    if (rec.attempts or 0) >= meta_number('max_attempts', 5) then
      rec.error = 'lease expired on the last attempt'
      rec.updated_at = now
      rec.expires_at = nil
      set_state(id, rec, 'dead', now)
      save(id, rec)
      return nil
    end
    bump('takeovers')
  end
  rec.token = (rec.token or 0) + 1
  rec.lease_id = lease_id
  rec.owner = worker
  rec.attempts = (rec.attempts or 0) + 1
  rec.leased_at = now
  rec.expires_at = now + ttl
  rec.updated_at = now
  set_state(id, rec, 'leased', rec.expires_at)
  save(id, rec)
  return {id, rec.token, lease_id, rec.expires_at, rec.attempts, rec.payload or '', takeover and 1 or 0, now}
end
