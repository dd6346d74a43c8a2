-- requeue: move dead items back to pending, due at once, with their attempts
-- reset. Named items that are not dead are left alone.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] N, the most items to requeue when none are named
-- ARGV[2...] item ids (none: the N oldest dead items)
--
-- Returns: the number of items requeued
-- @include "shard.lua"

local function main()
  local ids = {}
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
  if #ids == 0 then ids = rcall('ZRANGE', DEAD, 0, tonumber(ARGV[1]) - 1) end
  local now = now_ms()
  local moved = 0
  for _, id in ipairs(ids) do
    local rec = load(id)
    if rec and rec.state == 'dead' then
      rec.attempts = 0
      rec.updated_at = now
      set_state(id, rec, 'pending', now)
      save(id, rec)
      moved = moved + 1
    end
  end
  if moved > 0 then bump('requeued', moved) end
  return moved
end

return main()
