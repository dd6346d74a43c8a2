-- fail: the holder reports a failed attempt. The item is retried after an
-- exponential backoff with jitter while attempts < max attempts, else it goes
-- dead; a permanent failure goes dead at once. The error text is stored.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] item id
-- ARGV[2] token
-- ARGV[3] lease id ('' to check the token alone)
-- ARGV[4] error text
-- ARGV[5] '1' for a permanent failure, else '0'
-- ARGV[6] jitter, a number in [0, 1): the delay is backoff * (0.5 + jitter / 2)
--
-- Returns: {'retry' | 'dead', eligible_at ms (0 when dead), attempts, now ms}
-- Errors: INVALID <what>; NOT_FOUND item=<id>; LEASE_LOST item=<id> token=<t> current_token=<t> state=<s>
-- @include "shard.lua"

local function main()
  local id, token, lease_id, err_text = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
  local permanent, jitter = ARGV[5] == '1', tonumber(ARGV[6])
  if not jitter or jitter < 0 or jitter >= 1 then
    return fail('INVALID', 'jitter must be a number in [0, 1)')
  end
  local now = now_ms()
  local rec, err = held(id, token, lease_id, now)
  if not rec then return err end
  rec.error = err_text
  rec.updated_at = now
  rec.expires_at = nil
  bump('failures')
  if permanent or rec.attempts >= meta_number('max_attempts', 5) then
    set_state(id, rec, 'dead', now)
    save(id, rec)
    return {'dead', 0, rec.attempts, now}
  end
  local base, cap = meta_number('backoff_base_ms', 1000), meta_number('backoff_cap_ms', 300000)
  local backoff = math.min(cap, base * 2 ^ (rec.attempts - 1))
  local eligible = now + math.floor(backoff * (0.5 + jitter / 2))
  set_state(id, rec, 'pending', eligible)
  save(id, rec)
  bump('retries')
  return {'retry', eligible, rec.attempts, now}
end

return main()
