-- The prelude of every script, expanded where a script says
-- `-- @include "protocol.lua"`: the server clock, error replies, the protocol's
-- bounds (LIMITS, from limits.json) and the one argument checker.
--
-- A Lua error does not roll back the writes before it, so every script checks
-- all of its arguments with check_args/check_rest, and all of its keys with
-- check_keys, before its first write, and answers a bad one with
-- `INVALID <what>`, never a raw Lua error.
--
-- Keys: every script declares the keys it takes, in KEYS order, each as {name, type}, and
-- passes the list to check_keys before anything else. The type is what TYPE answers for
-- the key (hash, zset, stream, string, ...); a key of another type would make a command
-- fail with a raw WRONGTYPE error, maybe after other writes, so it is refused first with
-- `INVALID KEYS[<n>] (<name>) holds a <type>, not a <declared type>` (a missing key is
-- fine). A new script gets the check by declaring its keys.
local rcall = redis.call
-- @include "limits.json"

-- Milliseconds on the server clock: the only clock that decides lease expiry.
local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function fail(code, detail)
  return redis.error_reply(code .. ' ' .. detail)
end

local function finite(n)
  return type(n) == 'number' and n == n and n > -math.huge and n < math.huge
end

-- The accepted argument forms: decimal integers (no sign but '-', no hex, no
-- exponent, no spaces), decimal numbers (an exponent allowed), ids.
local INT = '^%-?%d+$'
local ID = '^[%w_%.:@/%+=%-]+$'

-- True when `s` is well-formed UTF-8 (no overlong forms, no surrogates).
local function utf8(s)
  if not s:find('[\128-\255]') then return true end
  local i, n = 1, #s
  while i <= n do
    local c = s:byte(i)
    if c < 128 then
      i = i + 1
    else
      local len = (c >= 194 and c <= 223 and 2) or (c >= 224 and c <= 239 and 3)
        or (c >= 240 and c <= 244 and 4)
      if not len or i + len - 1 > n then return false end
      for k = i + 1, i + len - 1 do
        local b = s:byte(k)
        if b < 128 or b > 191 then return false end
      end
      local b2 = s:byte(i + 1)
      if (c == 224 and b2 < 160) or (c == 237 and b2 > 159) or (c == 240 and b2 < 144)
          or (c == 244 and b2 > 143) then
        return false
      end
      i = i + len
    end
  end
  return true
end

local function decimal(raw)
  local mantissa = raw:match('^(%-?[%d%.]+)[eE][%-+]?%d+$') or raw
  return #raw <= 40 and (mantissa:find('^%-?%d+%.?%d*$') or mantissa:find('^%-?%d*%.%d+$')) ~= nil
end

-- True when `raw`, which cjson decoded, is JSON as every parser reads it: cjson also takes
-- nan, inf, hex, '+1' and '01' and nests 1000 deep. Outside strings every word must be true,
-- false, null or a number in JSON's form, and the nesting at most json_depth levels.
local function strict_json(raw)
  local bare = raw
  if bare:find('\\', 1, true) then bare = bare:gsub('\\.', '') end
  bare = bare:gsub('"[^"]*"', '""')
  for word in bare:gmatch('[^%s%[%]{}:,"]+') do
    if not word:find('^[1-9]%d*$') and word ~= '0' and word ~= 'true' and word ~= 'false'
        and word ~= 'null' then  -- the commonest words first: whole numbers, then literals
      local digits, rest = word:match('^%-?(%d+)(.*)$')
      if not digits or (#digits > 1 and digits:sub(1, 1) == '0') then return false end
      if rest ~= '' and rest:gsub('^%.%d+', ''):gsub('^[eE][%-+]?%d+', '') ~= '' then
        return false
      end
    end
  end
  -- The text decoded, so its brackets pair up: n levels take 2n of its characters.
  if #bare <= 2 * LIMITS.bounds.json_depth[2] + 1 then return true end
  local brackets, level = bare:gsub('[^%[%]{}]', ''), 0
  while brackets ~= '' do  -- each pass removes the innermost level
    level = level + 1
    if level > LIMITS.bounds.json_depth[2] then return false end
    brackets = brackets:gsub('[%[{][%]}]', '')
  end
  return true
end

-- Checks one value of kind `kind` against the bound named `bound`; returns the
-- value (a number for int and num) or nil and the reason.
--   int   a decimal integer within the bound
--   num   a finite decimal number within the bound
--   id    1 to id_length characters from A-Z a-z 0-9 _ - . : @ / + =
--   id?   an id or '' (absent)
--   text  UTF-8 text of the bound's lowest to highest number of bytes
--   json  UTF-8 JSON text (strict_json) of at most the bound's bytes, also as escaped inside a
--         JSON string (the bound records of earlier versions needed; kept so the same texts pass)
--   one   one of the words in `bound` (a table)
local function check_value(kind, bound, raw)
  if type(raw) ~= 'string' then return nil, 'is missing' end
  if kind == 'int' or kind == 'num' then
    local ok
    if kind == 'int' then ok = #raw <= 15 and raw:find(INT) else ok = decimal(raw) end
    local n = ok and tonumber(raw)
    if not finite(n) then return nil, 'must be a ' .. (kind == 'int' and 'whole' or 'finite')
      .. ' number, got ' .. raw:sub(1, 40) end
    local range = LIMITS.bounds[bound]
    if n < range[1] or n > range[2] then
      return nil, 'must be from ' .. range[1] .. ' to ' .. range[2] .. ', got ' .. raw:sub(1, 40)
    end
    return n
  end
  if kind == 'id' or kind == 'id?' then
    if raw == '' and kind == 'id?' then return raw end
    if #raw > LIMITS.bounds.id_length[2] or not raw:find(ID) then
      return nil, 'must be 1-' .. LIMITS.bounds.id_length[2]
        .. ' characters from A-Z a-z 0-9 _ - . : @ / + ='
    end
    return raw
  end
  if kind == 'text' or kind == 'json' then
    local least, most = LIMITS.bounds[bound][1], LIMITS.bounds[bound][2]
    if #raw > most then return nil, 'is ' .. #raw .. ' bytes, over ' .. most end
    if #raw < least then return nil, 'is ' .. #raw .. ' bytes, under ' .. least end
    if kind == 'json' and raw == 'null' then return raw end  -- the commonest: 4 bytes as stored
    if not utf8(raw) then return nil, 'must be UTF-8 text' end
    if kind == 'json' then
      if not pcall(cjson.decode, raw) or not strict_json(raw) then
        return nil, 'must be JSON text, at most ' .. LIMITS.bounds.json_depth[2] .. ' levels deep'
      end
      -- As escaped inside a JSON string: each byte takes at most 6 (\u00XX).
      local stored = #raw * 6 <= most and 0 or #cjson.encode(raw) - 2
      if stored > most then return nil, 'is ' .. stored .. ' bytes as stored, over ' .. most end
    end
    return raw
  end
  if kind == 'one' then
    for _, word in ipairs(bound) do
      if raw == word then return raw end
    end
    return nil, 'must be one of ' .. table.concat(bound, ', ')
  end
  return nil, 'has an unknown kind ' .. kind
end

-- Checks ARGV against `spec`, a list of {index, kind, bound[, default]}; an
-- argument with a default may be absent or ''. Returns the checked values by
-- index, or nil and an INVALID error reply.
local function check_args(spec)
  local values = {}
  for _, s in ipairs(spec) do
    local index, kind, bound, default = s[1], s[2], s[3], s[4]
    local raw = ARGV[index]
    if default ~= nil and (raw == nil or raw == '') then
      values[index] = default
    else
      local value, why = check_value(kind, bound, raw)
      if value == nil then return nil, fail('INVALID', 'ARGV[' .. index .. '] ' .. why) end
      values[index] = value
    end
  end
  return values
end

-- Checks the variadic tail ARGV[first...]: groups of #kinds arguments, each
-- {kind, bound}, at most `most` groups (a bound name). Returns the groups as
-- lists, or nil and an INVALID error reply.
local function check_rest(first, kinds, most)
  local count, width = math.max(0, #ARGV - first + 1), #kinds
  if count % width ~= 0 then
    return nil, fail('INVALID', 'ARGV[' .. first .. '...] must come in groups of ' .. width)
  end
  if count / width > LIMITS.bounds[most][2] then
    return nil, fail('INVALID', 'at most ' .. LIMITS.bounds[most][2] .. ' per call')
  end
  local groups = {}
  for i = first, #ARGV, width do
    local group = {}
    for k = 1, width do
      local kind = kinds[k]
      local value, why = check_value(kind[1], kind[2], ARGV[i + k - 1])
      if value == nil then return nil, fail('INVALID', 'ARGV[' .. (i + k - 1) .. '] ' .. why) end
      group[k] = value
    end
    groups[#groups + 1] = group
  end
  return groups
end

-- Checks KEYS against `declared`, the script's keys in KEYS order, each {name, type}:
--   the count: #declared keys (at least that many when `open`: the script checks the rest);
--   the names, when the first key has one: the keys are one base name with these suffixes
--     ('' for the base itself), the base carrying a hash tag, so that a caller cannot mix two
--     shards' keys or put one key in another's place (a name of false: any key);
--   the types: each key holds its declared type or nothing.
-- Returns nil or an INVALID error reply.
local function check_keys(declared, open)
  local count = #declared
  if not (#KEYS == count or (open and #KEYS >= count)) then
    return fail('INVALID', 'expected ' .. (open and 'at least ' or '') .. count .. ' keys, got ' .. #KEYS)
  end
  local named = declared[1][1]
  if named then
    local first = named == '' and '' or ':' .. named
    local base = KEYS[1]:sub(1, #KEYS[1] - #first)
    if KEYS[1] ~= base .. first or not base:find('{', 1, true) then
      return fail('INVALID', 'KEYS[1] must carry a hash tag and end in "' .. first .. '"')
    end
    -- A record named by its tag alone (a run's, the workers') ends in that tag, so no
    -- other key of the same tag (a shard's items, say) is taken for it.
    if named == '' and base:sub(-1) ~= '}' then
      return fail('INVALID', 'KEYS[1] must end in its hash tag')
    end
    for i = 2, count do
      local name = declared[i][1]
      if name and KEYS[i] ~= base .. ':' .. name then
        return fail('INVALID', 'KEYS[' .. i .. '] must be ' .. base .. ':' .. name)
      end
    end
  end
  for i = 1, count do
    local want = declared[i][2]
    local have = rcall('TYPE', KEYS[i]).ok
    if have ~= want and have ~= 'none' then
      local name = declared[i][1]
      return fail('INVALID', 'KEYS[' .. i .. ']' .. (name and name ~= '' and ' (' .. name .. ')' or '')
        .. ' holds a ' .. have .. ', not a ' .. want)
    end
  end
  return nil
end

-- `declared` followed by the keys of `more` (key lists as check_keys takes them).
local function keys_with(declared, more)
  local all = {}
  for _, key in ipairs(declared) do all[#all + 1] = key end
  for _, key in ipairs(more) do all[#all + 1] = key end
  return all
end
