-- add_items: add items to a shard; an item that exists already is left alone.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- ARGV[1] run id (id)
-- ARGV[2] shard number (int, bound shard)
-- ARGV[3] max attempts per item, set once, on the shard's first add (int, bound attempts)
-- ARGV[4] backoff base in ms, set once (int, bound backoff_ms)
-- ARGV[5] backoff cap in ms, set once (int, bound backoff_ms)
-- ARGV[6] the run's deadline in ms, set once; 0 for none (int, bound time_ms)
-- ARGV[7...] pairs of item id (id), payload (json, bound json_bytes); at most add_batch pairs
--
-- Counters: added (items added new).
-- Returns: an array with one entry per item, 1 when added, 0 when it existed. The payload is
--   stored as given, at the end of the item's record (a null payload is not stored).
-- Errors: INVALID <what>; RUN_CLOSED run=<id> reason=closed deadline=0 when the shard is closed
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"

local function main()
  local bad = check_keys(SHARD_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'shard'}, {3, 'int', 'attempts'},
    {4, 'int', 'backoff_ms'}, {5, 'int', 'backoff_ms'}, {6, 'int', 'time_ms'}})
  if bad then return bad end
  local pairs_
  pairs_, bad = check_rest(7, {{'id'}, {'json', 'json_bytes'}}, 'add_batch')
  if bad then return bad end
  if rcall('HGET', META, 'closed') == '1' then
    return fail('RUN_CLOSED', 'run=' .. A[1] .. ' reason=closed deadline=0')
  end
  local now = now_ms()
  for i, field in ipairs({'run', 'shard', 'max_attempts', 'backoff_base_ms', 'backoff_cap_ms',
      'deadline_at'}) do
    rcall('HSETNX', META, field, ARGV[i])
  end
  rcall('HSETNX', META, 'created_at', now)
  local ids = {}
  for _, pair in ipairs(pairs_) do ids[#ids + 1] = pair[1] end
  prefetch(ids)
  local added, count = {}, 0
  for _, pair in ipairs(pairs_) do
    local id = pair[1]
    if load(id) then
      added[#added + 1] = 0
    else
      local rec = {payload = pair[2] ~= 'null' and pair[2] or nil}
      local err = put(id, rec, 'pending', now)
      added[#added + 1] = err and 0 or 1
      if not err then count = count + 1 end
    end
  end
  if count > 0 then bump('added', count) end
  return added
end

return flushed(main)
