-- Staged writes: a shard script stages its writes and sends them once, at its end
-- (flush): one multi-member ZADD or ZREM per index, one HSET and one HDEL on items, one
-- HINCRBY per counter, one XADD per attempt log entry. A script checks everything before
-- it stages, so a refused call writes nothing but its counters and, for a LEASE_LOST
-- refusal, its log entry.
--
-- A script that stages writes ends in `return flushed(main)`: its body is the function
-- main, and whichever way main returns, its staged writes are sent before the reply. It
-- calls flush nowhere else (tests/test_registry.py checks both).
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "numbers.lua"

local staged_z = {}      -- index key -> {member -> score, or false to remove}
local staged_order = {}  -- index key -> its staged members, in the order first staged
local staged_h = {}      -- items field -> value, or false to delete
local staged_n = {}      -- counter -> increment
local staged_log = {}    -- attempt log entries in order, 10 values each (the fields of KEYS[8])

local function stage_z(key, member, score)
  local t = staged_z[key]
  if not t then t = {}; staged_z[key] = t; staged_order[key] = {} end
  if t[member] == nil then
    local order = staged_order[key]
    order[#order + 1] = member
  end
  t[member] = score
end

local function stage_h(field, value)
  staged_h[field] = value
end

local function bump(counter, by)
  staged_n[counter] = (staged_n[counter] or 0) + (by or 1)
end

-- Stages one attempt log entry: its 10 values, in the order of its fields (attempt_log.lua).
local function stage_log(item, attempt, token, event, queue, run, worker, trace, err, label)
  local log, n = staged_log, #staged_log
  log[n + 1], log[n + 2], log[n + 3], log[n + 4], log[n + 5] = item, attempt, token, event, queue
  log[n + 6], log[n + 7], log[n + 8], log[n + 9], log[n + 10] = run, worker, trace, err, label
end

-- Sends `list` as arguments of `cmd key ...`, a few thousand at a time (Lua's stack bound).
local function multi(cmd, key, list)
  for i = 1, #list, 4000 do
    rcall(cmd, key, unpack(list, i, math.min(#list, i + 3999)))
  end
end

-- An index of a few members is a listpack, sorted by score then member, that ZADD and ZREM
-- walk from its head. Items are staged in index order (claimed in due order, committed in
-- claim order, and a batch shares its scores), so removals go in that order, each found
-- near the head, and additions in reverse, each placed before the members added just
-- before it: in random order each would walk half the list.
local function flush()
  for key, members in pairs(staged_z) do
    local add, rem, order = {}, {}, staged_order[key]
    for i = 1, #order do
      local member = order[i]
      if members[member] == false then rem[#rem + 1] = member end
    end
    for i = #order, 1, -1 do  -- scores as text (num): a batch's few times converted once each
      local member = order[i]
      local score = members[member]
      if score then add[#add + 1] = num(score); add[#add + 1] = member end
    end
    if #rem > 0 then multi('ZREM', key, rem) end
    if #add > 0 then multi('ZADD', key, add) end
  end
  local set, del = {}, {}
  for field, value in pairs(staged_h) do
    if value then set[#set + 1] = field; set[#set + 1] = value else del[#del + 1] = field end
  end
  if #del > 0 then multi('HDEL', ITEMS, del) end
  if #set > 0 then multi('HSET', ITEMS, set) end
  for counter, by in pairs(staged_n) do
    if by ~= 0 then rcall('HINCRBY', COUNTS, counter, by) end
  end
  local log = staged_log
  for i = 1, #log, 10 do
    if i + 10 <= #log then
      rcall('XADD', ATTEMPTS, '*', 'item', log[i], 'attempt', log[i + 1], 'token', log[i + 2],
        'event', log[i + 3], 'queue_ms', log[i + 4], 'run_ms', log[i + 5], 'worker', log[i + 6],
        'trace', log[i + 7], 'error', log[i + 8], 'label', log[i + 9])
    else  -- the call's last entry trims the log, once
      rcall('XADD', ATTEMPTS, 'MAXLEN', '~', LIMITS.defaults.attempt_log, '*', 'item', log[i],
        'attempt', log[i + 1], 'token', log[i + 2], 'event', log[i + 3], 'queue_ms', log[i + 4],
        'run_ms', log[i + 5], 'worker', log[i + 6], 'trace', log[i + 7], 'error', log[i + 8],
        'label', log[i + 9])
    end
  end
  staged_z, staged_order, staged_h, staged_n, staged_log = {}, {}, {}, {}, {}
end

-- Runs the script's body `main` and sends its staged writes, then gives main's reply: the
-- one way a shard script returns, so no path can leave staged writes unsent.
local function flushed(main)
  local reply = main()
  flush()
  return reply
end
