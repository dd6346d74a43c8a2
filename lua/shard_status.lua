-- shard_status: one consistent snapshot of a shard, read on the server clock.
-- Reads only; O(1) in the shard's size.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- (no ARGV)
--
-- Returns: {counts as a flat field/value array (the counters, then pending, leased
--   and dead from their indexes), eligible-at of the first due
--   item or '', start of the oldest lease or '', now ms, meta as a flat array}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"

local function main()
  local bad = check_keys(SHARD_KEYS)
  if bad then return bad end
  local first_due = rcall('ZRANGE', DUE, 0, 0, 'WITHSCORES')
  local first_held = rcall('ZRANGE', HELD, 0, 0, 'WITHSCORES')
  local counts = rcall('HGETALL', COUNTS)
  for _, pair in ipairs({{'pending', DUE}, {'leased', LEASES}, {'dead', DEAD}}) do
    counts[#counts + 1] = pair[1]
    counts[#counts + 1] = rcall('ZCARD', pair[2])
  end
  return {counts, first_due[2] or '', first_held[2] or '', now_ms(), rcall('HGETALL', META)}
end

return main()
