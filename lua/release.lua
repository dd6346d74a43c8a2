-- release: the holder gives its item back unprocessed. It is due again at
-- once (or after a delay) and the attempt is not counted; the token is kept
-- (it never goes back).
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] item id
-- ARGV[2] token
-- ARGV[3] lease id ('' to check the token alone)
-- ARGV[4] optional delay in ms before the item is due again (default 0)
--
-- Returns: {now ms}
-- Errors: INVALID <what>; NOT_FOUND item=<id>; LEASE_LOST item=<id> token=<t> current_token=<t> state=<s>
-- @include "shard.lua"

local function main()
  local id, token, lease_id = ARGV[1], tonumber(ARGV[2]), ARGV[3]
  local now = now_ms()
  local rec, err = held(id, token, lease_id, now)
  if not rec then return err end
  rec.attempts = math.max(0, rec.attempts - 1)
  rec.expires_at = nil
  rec.updated_at = now
  set_state(id, rec, 'pending', now + math.max(0, tonumber(ARGV[4] or '0') or 0))
  save(id, rec)
  bump('releases')
  return {now}
end

return main()
