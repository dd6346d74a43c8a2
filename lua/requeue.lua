-- requeue: move dead items back to pending, due at once, with their attempts
-- reset. Named items that are not dead are left alone.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- ARGV[1] N, the most items to requeue when none are named (int, bound sweep)
-- ARGV[2...] item ids (id); none: the N oldest dead items; at most sweep ids
--
-- Counters: requeued, lost (index entries whose record vanished, dropped).
-- Returns: the number of items requeued
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"

local function main()
  local bad = check_keys(SHARD_KEYS)
  if bad then return bad end
  local A, named
  A, bad = check_args({{1, 'int', 'sweep'}})
  if bad then return bad end
  named, bad = check_rest(2, {{'id'}}, 'sweep')
  if bad then return bad end
  local ids = {}
  for _, group in ipairs(named) do ids[#ids + 1] = group[1] end
  if #ids == 0 then ids = rcall('ZRANGE', DEAD, 0, A[1] - 1) end
  local now = now_ms()
  local moved = 0
  prefetch(ids)
  for _, id in ipairs(ids) do
    local rec = load(id)
    if not rec then
      drop_orphan(id)
    elseif rec.state == 'dead' then
      rec.attempts = 0
      if not put(id, rec, 'pending', now) then moved = moved + 1 end
    end
  end
  if moved > 0 then bump('requeued', moved) end
  return moved
end

return flushed(main)
