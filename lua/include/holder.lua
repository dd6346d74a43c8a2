-- What the holder of a lease may do to its item, one function per operation, shared by
-- the single-item scripts (renew, commit, fail, release) and the batch (settle).
-- Each takes checked arguments, the server time and the caller's trace id ('' for none),
-- stages its writes and its attempt log entry, and returns its reply row, or nil and the
-- error reply (a refusal stages only its counters and, for LEASE_LOST, its log entry).
-- @include "record.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "shard_meta.lua"
-- @include "item_errors.lua"
-- @include "attempt_log.lua"
-- @include "holder_check.lua"

-- The stored outcome of a commit repeated with the same token and lease id, or nil.
local function repeated_commit(id, token, lease_id)
  local rec = load(id)
  if rec and rec.state == 'done' and rec.token == token and (lease_id == '' or rec.lease_id == lease_id) then
    local result = text_of(id, RESULT) or ''
    return {'repeated', rec.token, result, rec.done_at}
  end
  return nil
end

-- Marks the item done with `result` (JSON text, 'null' for none). `before` runs after the
-- holder check and before any write; it may refuse (conditions) with an error reply.
local function do_commit(id, token, lease_id, result, label, now, before, trace)
  local row = repeated_commit(id, token, lease_id)
  if row then return row end
  local rec, err = held(id, token, lease_id, now, 'stale_commits', nil, trace)
  if not rec then return nil, err end
  if before then
    err = before()
    if err then return nil, err end
  end
  local deadline = meta_number('deadline_at')
  local late = deadline > 0 and now >= deadline
  if result ~= 'null' then rec.set_result = result end  -- done is final: no result to clear
  if label ~= '' then rec.outcome = label end
  if late then rec.late = true end
  rec.done_at = now
  err = put(id, rec, 'done', now)
  if err then return nil, err end
  bump('commits')
  if rec.outcome then bump('outcome_' .. rec.outcome) end
  if late then bump('late_commits') end
  log_attempt(id, rec, 'committed', now, trace, nil, label)
  return {'committed', rec.token, result, now}
end

-- A failed attempt: retried after backoff * (0.5 + jitter / 2), or dead after the last
-- attempt or when `permanent`.
local function do_fail(id, token, lease_id, text, permanent, jitter, now, trace)
  local rec, err = held(id, token, lease_id, now, nil, nil, trace)
  if not rec then return nil, err end
  set_error(id, rec, text, now, trace)
  if permanent or out_of_attempts(rec) then
    err = put(id, rec, 'dead', now)
    if err then return nil, err end
    bump('failures')
    log_attempt(id, rec, 'dead', now, trace, text)
    return {'dead', 0, rec.attempts, now}
  end
  local base, cap = meta_number('backoff_base_ms'), meta_number('backoff_cap_ms')
  local backoff = math.min(cap, base * 2 ^ (rec.attempts - 1))
  local eligible = now + math.floor(backoff * (0.5 + jitter / 2))
  -- the entry before put moves eligible_at to the retry's
  local entry = {attempt_values(id, rec, 'retry', now, trace, text)}
  err = put(id, rec, 'pending', eligible)
  if err then return nil, err end
  stage_log(unpack(entry))
  bump('failures')
  bump('retries')
  return {'retry', eligible, rec.attempts, now}
end

-- Gives the item back, due after `delay` ms; the attempt is not counted.
local function do_release(id, token, lease_id, delay, now, trace)
  local rec, err = held(id, token, lease_id, now, nil, nil, trace)
  if not rec then return nil, err end
  local entry = {attempt_values(id, rec, 'released', now, trace)}  -- the attempt given back
  rec.attempts = math.max(0, (rec.attempts or 1) - 1)
  err = put(id, rec, 'pending', now + delay)
  if err then return nil, err end
  stage_log(unpack(entry))
  bump('releases')
  return {'released', now}
end

-- Extends the lease to `ttl` ms from now.
local function do_renew(id, token, lease_id, ttl, now, trace)
  local rec, err = held(id, token, lease_id, now, nil, nil, trace)
  if not rec then return nil, err end
  err = put(id, rec, 'leased', now + ttl)
  if err then return nil, err end
  bump('renewals')
  return {'renewed', rec.expires_at, now}
end
