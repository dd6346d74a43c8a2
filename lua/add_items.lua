-- add_items: add items to a shard; an item that exists already is left alone.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1] run id
-- ARGV[2] shard number
-- ARGV[3] max attempts per item (set once, on the shard's first add)
-- ARGV[4] backoff base in ms (set once)
-- ARGV[5] backoff cap in ms (set once)
-- ARGV[6], ARGV[7] ... pairs of item id, payload (JSON text)
--
-- Returns: an array with one entry per item, 1 when added, 0 when it existed.
-- Errors: RUN_CLOSED when the shard is closed; INVALID for non-numeric settings or an odd
--   number of id/payload arguments.
-- @include "shard.lua"

local function main()
  if is_closed() then return fail('RUN_CLOSED', 'run=' .. ARGV[1]) end
  for i = 2, 5 do
    if not tonumber(ARGV[i]) then return fail('INVALID', 'ARGV[' .. i .. '] must be a number') end
  end
  if (#ARGV - 5) % 2 ~= 0 then return fail('INVALID', 'items must be id, payload pairs') end
  local now = now_ms()
  rcall('HSETNX', META, 'run', ARGV[1])
  rcall('HSETNX', META, 'shard', ARGV[2])
  rcall('HSETNX', META, 'max_attempts', ARGV[3])
  rcall('HSETNX', META, 'backoff_base_ms', ARGV[4])
  rcall('HSETNX', META, 'backoff_cap_ms', ARGV[5])
  rcall('HSETNX', META, 'created_at', now)
  local added = {}
  for i = 6, #ARGV, 2 do
    local id = ARGV[i]
    if rcall('HEXISTS', ITEMS, id) == 1 then
      added[#added + 1] = 0
    else
      local rec = {payload = ARGV[i + 1], added_at = now}
      set_state(id, rec, 'pending', now)
      save(id, rec)
      added[#added + 1] = 1
    end
  end
  return added
end

return main()
