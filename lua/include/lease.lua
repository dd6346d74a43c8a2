-- A lease granted, and an expired lease ended: the rules of claims and takeovers.
-- @include "staged.lua"
-- @include "items.lua"
-- @include "shard_meta.lua"
-- @include "item_errors.lua"
-- @include "attempt_log.lua"

-- An expired lease ends its attempt: dead after the last attempt, else the
-- caller takes it over or makes it pending (`event`: takeover or expired, logged).
-- Returns true when it went dead.
local function expire_lease(id, rec, now, event)
  if not out_of_attempts(rec) then
    bump('expired')
    log_attempt(id, rec, event, now)
    return false
  end
  local text = 'lease expired on the last attempt'
  set_error(id, rec, text, now, '')
  if not put(id, rec, 'dead', now) then
    bump('expired')
    log_attempt(id, rec, 'dead', now, '', text)
  end
  return true
end

-- Grants a new lease on `rec` (pending and due, or leased with an expired lease).
-- The caller has checked the bar and counts the claims it granted.
-- Returns the claim reply row (with the payload text, '' for none); an expired lease
-- on its last attempt goes dead instead and the function returns nil.
local function grant(id, rec, worker, lease_id, ttl, now)
  local takeover = rec.state == 'leased'
  if takeover then
    if expire_lease(id, rec, now, 'takeover') then return nil end
    bump('takeovers')
    rec.regranted = true
    rec.eligible_at = rec.expires_at  -- claimable since its lease expired
  end
  rec.token = (rec.token or 0) + 1
  rec.lease_id = lease_id
  rec.owner = worker
  rec.attempts = (rec.attempts or 0) + 1
  rec.leased_at = now
  local err = put(id, rec, 'leased', now + ttl)
  if err then return nil, err end
  return {id, rec.token, lease_id, rec.expires_at, rec.attempts, rec.payload or '', takeover and 1 or 0, now}
end
