-- Guarded writes of a commit: the documented shapes, checked before any write.
-- Expanded where commit.lua says `-- @include "guards.lua"`.
--
-- Conditions, a JSON array of
--   {"if": "equals", "key": n, "field": f, "value": v}   hash field equals v (a hash key)
--   {"if": "exists", "key": n}  /  {"if": "missing", "key": n}
-- Writes, a JSON array of
--   {"do": "hset", "key": n, "fields": {f: v}}   {"do": "hdel", "key": n, "fields": [f]}
--   {"do": "sadd" | "srem", "key": n, "members": [m]}
--   {"do": "zadd", "key": n, "scores": {m: score}}   {"do": "zrem", "key": n, "members": [m]}
--   {"do": "del", "key": n}
-- n numbers the guarded keys KEYS[9...] from 1; each key is named once. Values, fields and members are
-- strings or finite numbers; scores are finite numbers. A guarded key may not be
-- one of the shard's own keys, may not lie under the store's prefix without the
-- shard's hash tag, and may not carry another hash tag than the shard's.
-- @include "protocol.lua"

local SHAPES = {hset = 'object', hdel = 'array', sadd = 'array', srem = 'array', zadd = 'object',
  zrem = 'array', del = false}
local DATA = {hset = 'fields', hdel = 'fields', sadd = 'members', srem = 'members', zadd = 'scores',
  zrem = 'members'}
local TYPES = {hset = 'hash', hdel = 'hash', sadd = 'set', srem = 'set', zadd = 'zset', zrem = 'zset'}
local OWN = {'meta', 'counts', 'items', 'due', 'leases', 'held', 'dead', 'effects', 'effects_unknown',
  'attempts'}

local function is_scalar(v)
  return type(v) == 'string' or finite(v)
end

-- 'array' for a non-empty list, 'object' for a non-empty string-keyed table, else nil.
local function shape_of(t)
  if type(t) ~= 'table' or next(t) == nil then return nil end
  local count = 0
  for k in pairs(t) do
    if type(k) ~= 'number' then
      for key in pairs(t) do if type(key) ~= 'string' then return nil end end
      return 'object'
    end
    count = count + 1
  end
  if count == #t then return 'array' end
  return nil
end

-- The hash tag of a key as Redis Cluster reads it: between the first { and the next }.
local function hash_tag(key)
  local open = key:find('{', 1, true)
  if not open then return nil end
  local close = key:find('}', open + 1, true)
  if not close or close == open + 1 then return nil end
  return key:sub(open + 1, close - 1)
end

-- Guarded key n is KEYS[GUARDED + n], after the shard's eight keys.
local GUARDED = 8

-- Checks that the guarded keys KEYS[9...] are the caller's own data.
local function check_guarded_keys()
  if #KEYS == GUARDED then return nil end
  local meta = KEYS[1]
  local tag, base = hash_tag(meta), meta:sub(1, #meta - #':meta')
  local prefix = meta:sub(1, (meta:find(':{', 1, true) or 1) - 1)
  local own = {}
  for _, name in ipairs(OWN) do own[base .. ':' .. name] = true end
  local seen = {}
  for i = GUARDED + 1, #KEYS do
    local key, key_tag = KEYS[i], hash_tag(KEYS[i])
    if seen[key] then return 'guarded key ' .. (i - GUARDED) .. ' repeats guarded key ' .. seen[key] end
    seen[key] = i - GUARDED
    if own[key] then return 'guarded key ' .. (i - GUARDED) .. ' is one of the shard\'s own keys' end
    if key_tag and key_tag ~= tag then
      return 'guarded key ' .. (i - GUARDED) .. ' carries the hash tag {' .. key_tag .. '}, not the shard\'s {'
        .. tag .. '}'
    end
    if not key_tag and key:sub(1, #prefix + 1) == prefix .. ':' then
      return 'guarded key ' .. (i - GUARDED) .. ' lies under the store\'s prefix without the shard\'s tag'
    end
  end
  return nil
end

-- Decodes a JSON array of specs; nil and the reason when it is not one.
local function decode_specs(text, what)
  if text == '[]' then return {} end
  if not text:find('^%s*%[') then return nil, what .. ' must be a JSON array' end
  local ok, specs = pcall(cjson.decode, text)
  if not ok or type(specs) ~= 'table' or (next(specs) ~= nil and shape_of(specs) ~= 'array') then
    return nil, what .. ' must be a JSON array'
  end
  return specs
end

local function check_key_number(n, what, guarded)
  if type(n) ~= 'number' or n % 1 ~= 0 or n < 1 or n > guarded then
    return what .. ' names key ' .. tostring(n) .. ' of ' .. guarded .. ' guarded keys'
  end
  return nil
end

local function check_data(w, i)
  local data = w[DATA[w['do']]]
  if shape_of(data) ~= SHAPES[w['do']] then
    return 'write ' .. i .. ' needs a non-empty ' .. SHAPES[w['do']] .. ' "' .. DATA[w['do']] .. '"'
  end
  for k, v in pairs(data) do
    if w['do'] == 'zadd' and not finite(v) then
      return 'write ' .. i .. ' needs a finite number score for ' .. tostring(k)
    end
    if not is_scalar(v) then return 'write ' .. i .. ' has a value that is not a string or number' end
  end
  return nil
end

-- Checks every condition and write; returns nil or the reason.
local function check_guards(conditions, writes)
  local guarded = #KEYS - GUARDED
  if #conditions + #writes > LIMITS.bounds.guard_specs[2] or guarded > LIMITS.bounds.guard_specs[2] then
    return 'at most ' .. LIMITS.bounds.guard_specs[2] .. ' guarded keys, conditions and writes'
  end
  for i, c in ipairs(conditions) do
    if type(c) ~= 'table' or (c['if'] ~= 'equals' and c['if'] ~= 'exists' and c['if'] ~= 'missing') then
      return 'condition ' .. i .. ' needs "if": equals, exists or missing'
    end
    local bad = check_key_number(c.key, 'condition ' .. i, guarded)
    if bad then return bad end
    if c['if'] == 'equals' and (type(c.field) ~= 'string' or not is_scalar(c.value)) then
      return 'condition ' .. i .. ' needs a string field and a string or number value'
    end
  end
  for i, w in ipairs(writes) do
    if type(w) ~= 'table' or SHAPES[w['do']] == nil then
      return 'write ' .. i .. ' needs "do": hset, hdel, sadd, srem, zadd, zrem or del'
    end
    local bad = check_key_number(w.key, 'write ' .. i, guarded)
    if not bad and SHAPES[w['do']] then bad = check_data(w, i) end
    if bad then return bad end
  end
  return check_guarded_keys()
end

-- A write to a key of another type would fail half-way, so the types are
-- checked, following the writes, first.
local function check_types(writes)
  local seen = {}
  for i, w in ipairs(writes) do
    local want = TYPES[w['do']]
    if want then
      local have = seen[w.key] or rcall('TYPE', KEYS[GUARDED + w.key]).ok
      if have ~= 'none' and have ~= want then
        return 'write ' .. i .. ' needs a ' .. want .. ' but key ' .. w.key .. ' holds a ' .. have
      end
      if have == 'none' and (w['do'] == 'hset' or w['do'] == 'sadd' or w['do'] == 'zadd') then
        seen[w.key] = want
      end
    else
      seen[w.key] = 'none'
    end
  end
  return nil
end

local function condition_holds(c)
  local key = KEYS[GUARDED + c.key]
  if c['if'] == 'exists' then return rcall('EXISTS', key) == 1 end
  if c['if'] == 'missing' then return rcall('EXISTS', key) == 0 end
  -- A key of another type has no fields (and HGET on it would fail): it does not hold.
  return rcall('TYPE', key).ok == 'hash' and rcall('HGET', key, c.field) == tostring(c.value)
end

local function apply(w)
  local key, op = KEYS[GUARDED + w.key], w['do']
  if op == 'del' then rcall('DEL', key)
  elseif op == 'hset' then
    for f, v in pairs(w.fields) do rcall('HSET', key, f, tostring(v)) end
  elseif op == 'zadd' then
    for m, s in pairs(w.scores) do rcall('ZADD', key, s, m) end
  else
    for _, m in ipairs(w[DATA[op]]) do rcall(string.upper(op), key, tostring(m)) end
  end
end
