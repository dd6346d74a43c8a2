-- commit: the holder marks its item done with a result, optionally applying
-- guarded writes atomically with the fence. Repeating a commit with the same
-- token and lease id returns the stored outcome and writes nothing.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- KEYS[8...] guarded keys, referred to by number from 1 in ARGV[5] and ARGV[6]
-- ARGV[1] item id
-- ARGV[2] token
-- ARGV[3] lease id ('' to check the token alone)
-- ARGV[4] result (JSON text)
-- ARGV[5] conditions, a JSON array ('[]' for none), each one of
--   {"if": "equals", "key": n, "field": f, "value": v}   hash field equals v
--   {"if": "exists", "key": n}  /  {"if": "missing", "key": n}
-- ARGV[6] writes, a JSON array ('[]' for none), each one of
--   {"do": "hset", "key": n, "fields": {f: v}}   {"do": "hdel", "key": n, "fields": [f]}
--   {"do": "sadd" | "srem", "key": n, "members": [m]}
--   {"do": "zadd", "key": n, "scores": {m: score}}   {"do": "zrem", "key": n, "members": [m]}
--   {"do": "del", "key": n}
--
-- ARGV[7] optional outcome label (e.g. released, renewed): counted as outcome_<label>
--
-- Returns: {'committed' | 'repeated', token, result, done_at ms}
-- Errors: INVALID <what>; NOT_FOUND item=<id>;
--   LEASE_LOST item=<id> token=<t> current_token=<t> state=<s>;
--   CONDITION_FAILED item=<id> condition=<n> (1-based; nothing was written)
-- @include "shard.lua"

local WRITE_SHAPES = {hset = 'fields', hdel = 'fields', sadd = 'members', srem = 'members',
  zadd = 'scores', zrem = 'members', del = true}

local function check_guards(conditions, writes)
  local guarded = #KEYS - 7
  for i, c in ipairs(conditions) do
    if type(c) ~= 'table' or (c['if'] ~= 'equals' and c['if'] ~= 'exists' and c['if'] ~= 'missing') then
      return 'condition ' .. i .. ' needs "if": equals, exists or missing'
    end
    if type(c.key) ~= 'number' or c.key < 1 or c.key > guarded then
      return 'condition ' .. i .. ' names key ' .. tostring(c.key) .. ' of ' .. guarded .. ' guarded keys'
    end
    if c['if'] == 'equals' and (type(c.field) ~= 'string' or c.value == nil) then
      return 'condition ' .. i .. ' needs a field and a value'
    end
  end
  for i, w in ipairs(writes) do
    local shape = type(w) == 'table' and WRITE_SHAPES[w['do']]
    if not shape then return 'write ' .. i .. ' needs "do": hset, hdel, sadd, srem, zadd, zrem or del' end
    if type(w.key) ~= 'number' or w.key < 1 or w.key > guarded then
      return 'write ' .. i .. ' names key ' .. tostring(w.key) .. ' of ' .. guarded .. ' guarded keys'
    end
    if shape ~= true and (type(w[shape]) ~= 'table' or next(w[shape]) == nil) then
      return 'write ' .. i .. ' needs a non-empty "' .. shape .. '"'
    end
    if w['do'] == 'zadd' then
      for m, score in pairs(w.scores) do
        local n = tonumber(score)
        if not n or n ~= n then return 'write ' .. i .. ' needs a number score for ' .. tostring(m) end
      end
    end
  end
  return nil
end

local WRITE_TYPES = {hset = 'hash', hdel = 'hash', sadd = 'set', srem = 'set', zadd = 'zset',
  zrem = 'zset'}

-- A write to a key of another type would fail half-way (a Lua error keeps the
-- writes before it), so the types are checked, following the writes, first.
local function check_types(writes)
  local seen = {}
  for i, w in ipairs(writes) do
    local want = WRITE_TYPES[w['do']]
    if want then
      local have = seen[w.key] or rcall('TYPE', KEYS[7 + w.key]).ok
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
  local key = KEYS[7 + c.key]
  if c['if'] == 'exists' then return rcall('EXISTS', key) == 1 end
  if c['if'] == 'missing' then return rcall('EXISTS', key) == 0 end
  return rcall('HGET', key, c.field) == tostring(c.value)
end

local function apply(w)
  local key = KEYS[7 + w.key]
  local op = w['do']
  if op == 'del' then rcall('DEL', key)
  elseif op == 'hset' then
    for f, v in pairs(w.fields) do rcall('HSET', key, f, tostring(v)) end
  elseif op == 'zadd' then
    for m, s in pairs(w.scores) do rcall('ZADD', key, tonumber(s), m) end
  else
    for _, m in ipairs(w[WRITE_SHAPES[op]]) do rcall(string.upper(op), key, tostring(m)) end
  end
end

local function main()
  local id, token, lease_id, result = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
  local function decode(text)  -- the common case, no guards, skips the decoder
    if text == '[]' then return true, {} end
    return pcall(cjson.decode, text)
  end
  local ok_c, conditions = decode(ARGV[5])
  local ok_w, writes = decode(ARGV[6])
  if not ok_c or not ok_w or type(conditions) ~= 'table' or type(writes) ~= 'table' then
    return fail('INVALID', 'guarded conditions and writes must be JSON arrays')
  end
  local bad = check_guards(conditions, writes)
  if bad then return fail('INVALID', bad) end
  local existing = load(id)
  if existing and existing.state == 'done' and existing.token == token
      and (lease_id == '' or existing.lease_id == lease_id) then
    return {'repeated', existing.token, existing.result or '', existing.done_at}
  end
  local now = now_ms()
  local rec, err = held(id, token, lease_id, now, 'stale_commits', existing)
  if not rec then return err end
  for i, c in ipairs(conditions) do
    if not condition_holds(c) then
      return fail('CONDITION_FAILED', 'item=' .. id .. ' condition=' .. i)
    end
  end
  bad = check_types(writes)
  if bad then return fail('INVALID', bad) end
  for _, w in ipairs(writes) do apply(w) end
  rec.result = result
  if ARGV[7] and ARGV[7] ~= '' then rec.outcome = ARGV[7] end
  rec.done_at = now
  rec.updated_at = now
  rec.expires_at = nil
  set_state(id, rec, 'done', now)
  save(id, rec)
  bump('commits')
  if rec.outcome then bump('outcome_' .. rec.outcome) end
  return {'committed', rec.token, result, now}
end

return main()
