-- shard_status: one consistent snapshot of a shard, read on the server clock: its counts and
-- the first entries its ages are read from, as a run's status reads them per shard (in plain
-- reads there, which a read-only user may send; a test keeps the two equal).
-- Reads only; O(1) in the shard's size.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- KEYS[8] effects_unknown: zset, the unknown effects, idempotency key -> since (ms)
-- (no ARGV)
--
-- Returns: {counts as a flat field/value array (the counters, then pending, leased
--   and dead from their indexes), eligible-at of the first due
--   item or '', start of the oldest lease or '', now ms, meta as a flat array,
--   since when the oldest unknown effect is unknown or ''}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"

local UNKNOWN = KEYS[8]
local KEYS_TAKEN = keys_with(SHARD_KEYS, {{'effects_unknown', 'zset'}})

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local first_due = rcall('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  local first_held = rcall('ZRANGE', HELD, 0, 0, 'WITHSCORES')
  local first_unknown = rcall('ZRANGE', UNKNOWN, 0, 0, 'WITHSCORES')
  local counts = rcall('HGETALL', COUNTS)
  for _, pair in ipairs({{'pending', DUE}, {'leased', LEASES}, {'dead', DEAD}}) do
    counts[#counts + 1] = pair[1]
    counts[#counts + 1] = rcall('ZCARD', pair[2])
  end
  return {counts, first_due[2] or '', first_held[2] or '', now_ms(), rcall('HGETALL', META),
    first_unknown[2] or ''}
end

return main()
