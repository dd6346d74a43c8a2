-- The holder check: whether a caller still holds an item's lease (state leased, same token,
-- same lease id when given, not expired), and the LEASE_LOST refusal when it does not.
-- @include "protocol.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "attempt_log.lua"

-- The plain-words reason a holder check refused: state, token, lease or expired.
local function lost_reason(rec, token, lease_id, now)
  if rec.state ~= 'leased' then return 'state' end
  if rec.token ~= token then return 'token' end
  if lease_id ~= '' and rec.lease_id ~= lease_id then return 'lease' end
  return 'expired'
end

-- The holder check shared by renew, commit, fail, release and effects.
-- Returns the record, or nil and the error reply. A refusal is counted in
-- stale_refused and, when given, in the counter `refused` (e.g. stale_commits), and
-- logged with the caller's `trace`. `loaded` is the item's record when the caller has
-- read it already.
local function held(id, token, lease_id, now, refused, loaded, trace)
  local rec = loaded or load(id)
  if not rec then return nil, fail('NOT_FOUND', 'item=' .. id) end
  if rec.state == 'leased' and rec.token == token and (lease_id == '' or rec.lease_id == lease_id)
      and not lease_expired(rec, now) then
    return rec
  end
  bump('stale_refused')
  if refused then bump(refused) end
  local detail = 'LEASE_LOST item=' .. id .. ' token=' .. token .. ' current_token=' .. (rec.token or 0)
    .. ' state=' .. rec.state .. ' reason=' .. lost_reason(rec, token, lease_id, now)
    .. ' expires_at=' .. (rec.expires_at or 0)
  log_refusal(id, token, trace, detail)
  return nil, redis.error_reply(detail)
end
