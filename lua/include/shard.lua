-- Shared prelude of every shard script, expanded where a script says
-- `-- @include "shard.lua"`. It names the shard keys and holds the one
-- definition of each state rule: an item's move between states and indexes,
-- lease expiry, the last attempt, the deadline, and the holder check; and it
-- writes the attempt log.
--
-- Shard keys (all share the hash tag {<run_id>#<shard>}; each script checks their names and
-- types with check_keys, SHARD_KEYS or LOGGED_KEYS below, before its first write):
--   KEYS[1] meta     hash: run, shard, max_attempts, backoff_base_ms, backoff_cap_ms,
--                    deadline_at (ms, 0 = none), closed
--   KEYS[2] counts   hash: done and the event counters (pending, leased, dead: ZCARD of due,
--                    leases, dead); added, lost and late_commits keep a run's accounting
--   KEYS[3] items    hash: <item id> -> the record, packed as
--                      state|token|attempts|lease id|owner|leased_at|expires_at|done_at|
--                      outcome|late|eligible_at|payload
--                    (times in ms; '' = none; eligible_at: when the item last became claimable,
--                    its due score as put or the expiry of the lease a claim took over; the
--                    payload is the JSON text as given, last, copied and never decoded here),
--                    and beside it <item id>#r -> result JSON, <item id>#e -> its last errors.
--                    '#' is in no id. <item id>#e holds a JSON array of the last error_history
--                    (limits.json) errors, oldest first, each {"error": text, "attempt": n,
--                    "at": ms, "trace": id}; a plain text there (an earlier version's one
--                    error) is read as one error. Records of earlier versions are read too
--                    and rewritten in this form when they change: the 11-field form (no
--                    eligible_at) and a JSON object holding payload, result and error.
--   KEYS[4] due      zset: pending items by eligible-at (ms)
--   KEYS[5] leases   zset: leased items by lease expiry (ms)
--   KEYS[6] held     zset: leased items by lease start (ms)
--   KEYS[7] dead     zset: dead items by time of death (ms)
--   KEYS[8] attempts stream: the attempt log, capped with XADD MAXLEN ~ attempt_log
--                    (limits.json); only the scripts that end attempts take it (claim,
--                    claim_next, renew, commit, fail, release, settle, reap, record_effect).
--                    One entry per ended attempt, written in the same call as the change:
--                      item, attempt, token, event, queue_ms, run_ms, worker, trace, error, label
--                    event: committed | retry | dead | released (the holder settled it),
--                    takeover (a claim took over its expired lease), expired (reap made it
--                    pending again), refused (a holder call refused with LEASE_LOST: token is
--                    the caller's, error the refusal's detail, attempt, worker and times '').
--                    queue_ms: eligible_at to leased_at (the wait before the claim); run_ms:
--                    leased_at to the entry; trace: the trace id the holder sent ('' for
--                    takeover and expired); error: the failure's text; label: a commit's
--                    outcome label. A field without a value is ''. The entry id is its time.
--
-- Writes are staged and sent once per script (flush): one multi-member ZADD or ZREM per
-- index, one HSET and one HDEL on items, one HINCRBY per counter, one XADD per log entry.
-- A script checks everything before flush, so a refused call writes nothing but its
-- counters and, for a LEASE_LOST refusal, its log entry.
-- @include "protocol.lua"
local META, COUNTS, ITEMS, DUE, LEASES, HELD, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local ATTEMPTS = KEYS[8]  -- the attempt log, in the scripts that take LOGGED_KEYS
local INDEX = {pending = DUE, leased = LEASES, dead = DEAD}
-- The shard's keys with their types, as check_keys takes them: SHARD_KEYS, and LOGGED_KEYS
-- (with the attempt log) for the scripts that end attempts.
local SHARD_KEYS = {{'meta', 'hash'}, {'counts', 'hash'}, {'items', 'hash'}, {'due', 'zset'},
  {'leases', 'zset'}, {'held', 'zset'}, {'dead', 'zset'}}
local LOGGED_KEYS = keys_with(SHARD_KEYS, {{'attempts', 'stream'}})
local RESULT, ERROR = '#r', '#e'
local RECORD = '^(%l+)|(%d*)|(%d*)|([^|]*)|([^|]*)|(%d*)|(%d*)|(%d*)|([^|]*)|(%d*)|(%d*)|(.*)$'
-- The 11-field form of earlier versions (no eligible_at). A JSON payload never begins with
-- digits and a '|', so no such record matches RECORD.
local RECORD_11 = '^(%l+)|(%d*)|(%d*)|([^|]*)|([^|]*)|(%d*)|(%d*)|(%d*)|([^|]*)|(%d*)|(.*)$'

-- Numbers as text, each converted once per call: the items of a batch share their times,
-- and a time read from a record keeps its text for the record's next encoding.
local number_texts = {}
local function num(n)
  if not n then return '' end
  local s = number_texts[n]
  if not s then s = tostring(n); number_texts[n] = s end
  return s
end

-- -- staged writes ---------------------------------------------------------------------
local staged_z = {}      -- index key -> {member -> score, or false to remove}
local staged_order = {}  -- index key -> its staged members, in the order first staged
local staged_h = {}      -- items field -> value, or false to delete
local staged_n = {}      -- counter -> increment
local staged_log = {}    -- attempt log entries in order, 10 values each (the fields of KEYS[8])
local cache = {}         -- item id -> record (false: none), as this call left it

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

-- Sends `list` as arguments of `cmd key ...`, a few thousand at a time (Lua's stack bound).
local function multi(cmd, key, list)
  for i = 1, #list, 4000 do
    rcall(cmd, key, unpack(list, i, math.min(#list, i + 3999)))
  end
end

-- An index of a few members is a listpack, sorted by score then member, that ZADD and ZREM
-- walk from its head. Items are staged in index order (claimed in due order, settled in
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

-- -- records ---------------------------------------------------------------------------
-- A time field of a record ('' for none) as a number, its text kept for num(); each text
-- converted once per call (the records of a batch share their times).
local text_numbers = {}
local function number_of(text)
  if text == '' then return nil end
  local n = text_numbers[text]
  if n then return n end
  n = tonumber(text)  -- the field is digits only: its text is tostring's unless it is
  if n and n < 1e14 and (#text == 1 or text:byte(1) ~= 48) then  -- long or starts with 0
    number_texts[n] = text
    text_numbers[text] = n
  end
  return n
end

local function decode(raw)
  if raw:sub(1, 1) == '{' then  -- an earlier version's JSON record: its texts move out on put
    local ok, rec = pcall(cjson.decode, raw)
    if not ok or type(rec) ~= 'table' or type(rec.state) ~= 'string' then return nil end
    rec.set_result, rec.set_error = rec.result or false, rec.error or false
    return rec
  end
  local s, tok, att, lid, own, lat, exp, don, out, late, elig, payload = raw:match(RECORD)
  if not s then
    s, tok, att, lid, own, lat, exp, don, out, late, payload = raw:match(RECORD_11)
    if not s then return nil end
  end
  return {state = s, token = tonumber(tok), attempts = tonumber(att),
    lease_id = lid ~= '' and lid or nil, owner = own ~= '' and own or nil,
    leased_at = number_of(lat), expires_at = number_of(exp), done_at = number_of(don),
    outcome = out ~= '' and out or nil, late = late == '1' or nil,
    eligible_at = elig and number_of(elig), payload = payload ~= '' and payload or nil}
end

-- One concatenation (Lua joins the whole chain at once; no table to build).
local function encode(rec)
  return rec.state .. '|' .. num(rec.token) .. '|' .. num(rec.attempts) .. '|'
    .. (rec.lease_id or '') .. '|' .. (rec.owner or '') .. '|' .. num(rec.leased_at) .. '|'
    .. num(rec.expires_at) .. '|' .. num(rec.done_at) .. '|' .. (rec.outcome or '') .. '|'
    .. (rec.late and '1' or '') .. '|' .. num(rec.eligible_at) .. '|' .. (rec.payload or '')
end

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

-- -- the shard's settings, read once per call -------------------------------------------
local meta_cache
local function meta_of()
  if not meta_cache then
    local v = rcall('HMGET', META, 'closed', 'deadline_at', 'max_attempts', 'backoff_base_ms',
      'backoff_cap_ms', 'run')
    meta_cache = {closed = v[1], deadline_at = v[2], max_attempts = v[3], backoff_base_ms = v[4],
      backoff_cap_ms = v[5], run = v[6]}
  end
  return meta_cache
end

local meta_numbers = {}
local function meta_number(field)
  local value = meta_numbers[field]
  if value then return value end
  value = tonumber(meta_of()[field])
  if not finite(value) then value = LIMITS.defaults[field] or 0 end
  meta_numbers[field] = value
  return value
end

local function run_name()
  return meta_of().run or '?'
end

-- The bar on new leases: the shard is closed, or its deadline has passed (server clock).
-- Returns nil, or the RUN_CLOSED error reply.
local function barred(now)
  local meta = meta_of()
  if meta.closed == '1' then
    return fail('RUN_CLOSED', 'run=' .. run_name() .. ' reason=closed deadline=0')
  end
  local deadline = tonumber(meta.deadline_at) or 0
  if finite(deadline) and deadline > 0 and now >= deadline then
    return fail('RUN_CLOSED', 'run=' .. run_name() .. ' reason=deadline deadline=' .. deadline)
  end
  return nil
end

-- Lease expiry: the record's expires_at, written only by put() together with
-- the leases index score, read only here.
local function lease_expired(rec, now)
  return rec.state == 'leased' and (rec.expires_at or 0) <= now
end

-- The last attempt: an item that has been claimed max_attempts times.
local function out_of_attempts(rec)
  return (rec.attempts or 0) >= meta_number('max_attempts')
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

-- -- the attempt log and the errors ---------------------------------------------------
-- Stages one log entry: its 10 values, in the order of the fields of KEYS[8].
local function stage_log(item, attempt, token, event, queue, run, worker, trace, err, label)
  local log, n = staged_log, #staged_log
  log[n + 1], log[n + 2], log[n + 3], log[n + 4], log[n + 5] = item, attempt, token, event, queue
  log[n + 6], log[n + 7], log[n + 8], log[n + 9], log[n + 10] = run, worker, trace, err, label
end

-- The values of the log entry of the attempt `rec` holds, ended now by `event`.
local function attempt_values(id, rec, event, now, trace, err, label)
  local queue, run = '', ''
  local leased, eligible = rec.leased_at, rec.eligible_at
  if leased then
    run = num(now - leased)
    if eligible and eligible <= leased then queue = num(leased - eligible) end
  end
  return id, num(rec.attempts), num(rec.token), event, queue, run, rec.owner or '', trace or '',
    err or '', label or ''
end

-- Stages the log entry of the attempt `rec` holds, ended now by `event`.
local function log_attempt(id, rec, event, now, trace, err, label)
  stage_log(attempt_values(id, rec, event, now, trace, err, label))
end

-- Stages the log entry of a holder call refused with LEASE_LOST (`detail`: the reply's text).
local function log_refusal(id, token, trace, detail)
  stage_log(id, '', num(token), 'refused', '', '', '', trace or '', detail, '')
end

-- Sets `text` as the item's newest error: <id>#e keeps the last error_history errors.
local function set_error(id, rec, text, now, trace)
  local errors = {}
  local old = rec.set_error or text_of(id, ERROR)  -- set_error: an earlier JSON record's error
  if old then
    local ok, list = false, nil
    if old:sub(1, 2) == '[{' then ok, list = pcall(cjson.decode, old) end
    if ok and type(list) == 'table' and type(list[1]) == 'table'
        and type(list[1].error) == 'string' then
      errors = list
    else
      errors = {{error = old}}  -- an earlier version's one error text
    end
  end
  errors[#errors + 1] = {error = text, attempt = rec.attempts, at = now,
    trace = trace ~= '' and trace or nil}
  local kept = {}
  for i = math.max(1, #errors - LIMITS.defaults.error_history + 1), #errors do
    kept[#kept + 1] = errors[i]
  end
  rec.set_error = cjson.encode(kept)
end

-- An index entry whose record vanished (evicted, deleted): dropped, never
-- wedging the shard, and counted as lost.
local function drop_orphan(id)
  local removed = 0
  for _, index in pairs(INDEX) do removed = removed + rcall('ZREM', index, id) end
  rcall('ZREM', HELD, id)
  if removed > 0 then bump('lost') end
end

-- An expired lease ends its attempt: dead after the last attempt, else the
-- caller takes it over or makes it pending (`event`: takeover or expired, logged).
-- Returns true when it went dead.
local function expire_lease(id, rec, now, event)
  if not out_of_attempts(rec) then
    bump('expired')
    log_attempt(id, rec, event, now)
    return false
  end
  local text = 'lease expired on the last attempt'
  set_error(id, rec, text, now, '')
  if not put(id, rec, 'dead', now) then
    bump('expired')
    log_attempt(id, rec, 'dead', now, '', text)
  end
  return true
end

-- The plain-words reason a holder check refused: state, token, lease or expired.
local function lost_reason(rec, token, lease_id, now)
  if rec.state ~= 'leased' then return 'state' end
  if rec.token ~= token then return 'token' end
  if lease_id ~= '' and rec.lease_id ~= lease_id then return 'lease' end
  return 'expired'
end

-- The holder check shared by renew, commit, fail, release and effects.
-- Returns the record, or nil and the error reply. A refusal is counted in
-- stale_refused and, when given, in the counter `refused` (e.g. stale_commits), and
-- logged with the caller's `trace`. `loaded` is the item's record when the caller has
-- read it already.
local function held(id, token, lease_id, now, refused, loaded, trace)
  local rec = loaded or load(id)
  if not rec then return nil, fail('NOT_FOUND', 'item=' .. id) end
  if rec.state == 'leased' and rec.token == token and (lease_id == '' or rec.lease_id == lease_id)
      and not lease_expired(rec, now) then
    return rec
  end
  bump('stale_refused')
  if refused then bump(refused) end
  local detail = 'LEASE_LOST item=' .. id .. ' token=' .. token .. ' current_token=' .. (rec.token or 0)
    .. ' state=' .. rec.state .. ' reason=' .. lost_reason(rec, token, lease_id, now)
    .. ' expires_at=' .. (rec.expires_at or 0)
  log_refusal(id, token, trace, detail)
  return nil, redis.error_reply(detail)
end

-- Grants a new lease on `rec` (pending and due, or leased with an expired lease).
-- The caller has checked the bar and counts the claims it granted.
-- Returns the claim reply row (with the payload text, '' for none); an expired lease
-- on its last attempt goes dead instead and the function returns nil.
local function grant(id, rec, worker, lease_id, ttl, now)
  local takeover = rec.state == 'leased'
  if takeover then
    if expire_lease(id, rec, now, 'takeover') then return nil end
    bump('takeovers')
    rec.regranted = true
    rec.eligible_at = rec.expires_at  -- claimable since its lease expired
  end
  rec.token = (rec.token or 0) + 1
  rec.lease_id = lease_id
  rec.owner = worker
  rec.attempts = (rec.attempts or 0) + 1
  rec.leased_at = now
  local err = put(id, rec, 'leased', now + ttl)
  if err then return nil, err end
  return {id, rec.token, lease_id, rec.expires_at, rec.attempts, rec.payload or '', takeover and 1 or 0, now}
end
