-- An item's record as this call sees it: read once (a cache), moved between states and
-- indexes by put, the one definition of each move, and lease expiry read from it.
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "record.lua"
-- @include "staged.lua"

local cache = {}  -- item id -> record (false: none), as this call left it

-- Reads the records of `ids` with one HMGET (and, with `texts`, each id's field `texts`,
-- e.g. the result) into the cache. Returns the texts by id.
local function prefetch(ids, texts)
  local fields, texts_of = {}, {}
  for _, id in ipairs(ids) do
    if cache[id] == nil then
      fields[#fields + 1] = id
      if texts then fields[#fields + 1] = id .. texts end
    end
  end
  if #fields == 0 then return texts_of end
  local raws
  if #fields <= 4000 then
    raws = rcall('HMGET', ITEMS, unpack(fields))
  else
    raws = {}
    for i = 1, #fields, 4000 do
      local part = rcall('HMGET', ITEMS, unpack(fields, i, math.min(#fields, i + 3999)))
      for k = 1, #part do raws[i + k - 1] = part[k] end
    end
  end
  local step = texts and 2 or 1
  for i = 1, #fields, step do
    local id, raw = fields[i], raws[i]
    if cache[id] == nil then cache[id] = raw and decode(raw) or false end
    if texts and raws[i + 1] then texts_of[id] = raws[i + 1] end
  end
  return texts_of
end

local function load(id)
  if cache[id] == nil then prefetch({id}) end
  return cache[id] or nil
end

-- One raw text of an item (payload, result or error), staged writes first.
local function text_of(id, suffix)
  local staged = staged_h[id .. suffix]
  if staged ~= nil then return staged or nil end
  return rcall('HGET', ITEMS, id .. suffix) or nil
end

-- Lease expiry: the record's expires_at, written only by put() together with
-- the leases index score, read only here.
local function lease_expired(rec, now)
  return rec.state == 'leased' and (rec.expires_at or 0) <= now
end

-- Stages `rec` in `state`: the indexes moved, the record and its changed texts
-- (rec.set_result, set_error: a text, or false to delete) saved.
-- pending, leased and dead are counted by their indexes (ZCARD), done by the
-- `done` counter. `score` is the index score: eligible-at for pending, time of
-- death for dead, lease expiry for leased (the lease start is rec.leased_at).
-- Returns nil, or an INVALID error reply when nothing was staged.
local function put(id, rec, state, score)
  local old = rec.state
  if state ~= 'done' and not finite(score) then return fail('INVALID', 'index score for ' .. id) end
  if state == 'leased' then rec.expires_at = score else rec.expires_at = nil end
  if state == 'pending' then rec.eligible_at = score end
  rec.state = state
  if INDEX[old] and INDEX[old] ~= INDEX[state] then stage_z(INDEX[old], id, false) end
  if old == 'leased' and state ~= 'leased' then stage_z(HELD, id, false) end
  if state == 'done' and old ~= 'done' then bump('done') end
  if INDEX[state] then stage_z(INDEX[state], id, score) end
  if state == 'leased' and (old ~= 'leased' or rec.regranted) then stage_z(HELD, id, rec.leased_at) end
  rec.regranted = nil
  if rec.set_result ~= nil then stage_h(id .. RESULT, rec.set_result ~= '' and rec.set_result) end
  if rec.set_error ~= nil then stage_h(id .. ERROR, rec.set_error ~= '' and rec.set_error) end
  rec.set_result, rec.set_error = nil, nil
  stage_h(id, encode(rec))
  cache[id] = rec
  return nil
end

-- An index entry whose record vanished (evicted, deleted): dropped, never
-- wedging the shard, and counted as lost.
local function drop_orphan(id)
  local removed = 0
  for _, index in pairs(INDEX) do removed = removed + rcall('ZREM', index, id) end
  rcall('ZREM', HELD, id)
  if removed > 0 then bump('lost') end
end
