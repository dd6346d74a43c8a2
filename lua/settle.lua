-- settle: many holder operations on one shard's items in one call (commits, failures,
-- releases, renewals), each fenced on its own, as if each were sent alone in this
-- order (an item may appear more than once). One refusal refuses only its own entry.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- ARGV[1...] groups of operation: commit|fail|release|renew (id), item id (id), token (int, bound token), lease id or '' (id?), detail (text, bound json_bytes), option (text, bound text_bytes), trace id of the attempt or '' (id?); at most batch groups
--   Per operation (each group checked in one pass, every group before the first write):
--     commit   detail: result (JSON text, bound json_bytes); option: outcome label (id) or ''
--     fail     detail: error text (bound error_bytes); option: 'permanent', or the jitter
--              of the retry's backoff (a number from 0 to 1, as in fail.lua)
--     release  detail: delay in ms before it is due again (int, bound delay_ms), '' for 0;
--              option: ''
--     renew    detail: new TTL in ms (int, bound ttl_ms); option: ''
--
-- Counters: as commit, fail, release and renew (commits, outcome_<label>, late_commits,
--   failures, retries, releases, renewals, stale_refused, stale_commits).
-- Log: as commit, fail, release and renew, with each group's trace id.
-- Returns: one row per group, in order:
--   commit   {'committed' | 'repeated', token, result, done_at ms}
--   fail     {'retry' | 'dead', eligible_at ms (0 when dead), attempts, now ms}
--   release  {'released', now ms}
--   renew    {'renewed', expires_at ms, now ms}
--   refused  {'refused', 'NOT_FOUND item=<id>' | 'LEASE_LOST item=<id> token=<t> current_token=<t>
--            state=<s> reason=<r> expires_at=<ms>'}
-- Errors: INVALID <what> (any bad argument: nothing is written)
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "holder.lua"

-- Each operation's kinds of detail and option (after the id, id, token, id? every group has;
-- the trace id, an id?, ends every group).
local KINDS = {
  commit = {{'json', 'json_bytes'}, {'id?'}},
  fail = {{'text', 'error_bytes'}, false},
  release = {{'int', 'delay_ms'}, {'one', {''}}},
  renew = {{'int', 'ttl_ms'}, {'one', {''}}},
}

local ID_MOST, TOKEN = LIMITS.bounds.id_length[2], LIMITS.bounds.token

-- The reply of a refused argument: check_value's reason, so each check below says what it does.
local function refuse(index, kind, bound, raw)
  local _, why = check_value(kind, bound, raw)
  return nil, fail('INVALID', 'ARGV[' .. index .. '] ' .. why)
end

-- Checks the groups ARGV[1...] in one pass, the id, token and id? checks of check_value inline
-- (a failing one asks check_value for its reason). A JSON text is checked once per call: the
-- check depends on the text alone, and the results of a batch are often the same text.
-- Returns the checked values, seven per group in a flat list, and the item ids; or nil and an
-- INVALID reply.
local function check_groups()
  if #ARGV % 7 ~= 0 then return nil, fail('INVALID', 'ARGV[1...] must come in groups of 7') end
  if #ARGV / 7 > LIMITS.bounds.batch[2] then
    return nil, fail('INVALID', 'at most ' .. LIMITS.bounds.batch[2] .. ' per call')
  end
  local values, ids, json_ok = {}, {}, {}
  for i = 1, #ARGV, 7 do
    local op, id, raw_token, lease_id, detail, option, trace =
      ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3], ARGV[i + 4], ARGV[i + 5], ARGV[i + 6]
    local kinds = KINDS[op]
    if not kinds then
      return nil, fail('INVALID', 'ARGV[' .. i .. '] must be one of commit, fail, release, renew')
    end
    if not (#id <= ID_MOST and id:find(ID)) then return refuse(i + 1, 'id', nil, id) end
    local token = #raw_token <= 15 and raw_token:find(INT) and tonumber(raw_token)
    if not (token and token >= TOKEN[1] and token <= TOKEN[2]) then
      return refuse(i + 2, 'int', 'token', raw_token)
    end
    if lease_id ~= '' and not (#lease_id <= ID_MOST and lease_id:find(ID)) then
      return refuse(i + 3, 'id?', nil, lease_id)
    end
    if trace ~= '' and not (#trace <= ID_MOST and trace:find(ID)) then
      return refuse(i + 6, 'id?', nil, trace)
    end
    if op == 'release' and detail == '' then detail = '0' end
    local why
    if op == 'commit' then
      if not json_ok[detail] then
        if check_value('json', 'json_bytes', detail) == nil then
          return refuse(i + 4, 'json', 'json_bytes', detail)
        end
        json_ok[detail] = true
      end
      if option ~= '' and not (#option <= ID_MOST and option:find(ID)) then
        return refuse(i + 5, 'id?', nil, option)
      end
    else
      detail, why = check_value(kinds[1][1], kinds[1][2], detail)
      if detail == nil then return nil, fail('INVALID', 'ARGV[' .. (i + 4) .. '] ' .. why) end
      if not kinds[2] then
        if option ~= 'permanent' then
          option, why = check_value('num', 'jitter', option)
          if option == nil then
            return nil, fail('INVALID', 'ARGV[' .. (i + 5) .. '] must be permanent or ' .. why)
          end
        end
      else
        option, why = check_value(kinds[2][1], kinds[2][2], option)
        if option == nil then return nil, fail('INVALID', 'ARGV[' .. (i + 5) .. '] ' .. why) end
      end
    end
    local n = #values
    values[n + 1], values[n + 2], values[n + 3] = op, id, token
    values[n + 4], values[n + 5], values[n + 6], values[n + 7] = lease_id, detail, option, trace
    ids[#ids + 1] = id
  end
  return values, ids
end

local function main()
  local bad = check_keys(LOGGED_KEYS)
  if bad then return bad end
  local values, ids = check_groups()
  if not values then return ids end
  local now = now_ms()
  prefetch(ids)
  local rows = {}
  for b = 0, #values - 1, 7 do
    local op, id, token, lease_id, detail, option, trace = values[b + 1], values[b + 2],
      values[b + 3], values[b + 4], values[b + 5], values[b + 6], values[b + 7]
    local row, err
    if op == 'commit' then
      row, err = do_commit(id, token, lease_id, detail, option, now, nil, trace)
    elseif op == 'fail' then
      local permanent = option == 'permanent'
      row, err = do_fail(id, token, lease_id, detail, permanent, tonumber(option) or 0, now, trace)
    elseif op == 'release' then
      row, err = do_release(id, token, lease_id, detail, now, trace)
    else
      row, err = do_renew(id, token, lease_id, detail, now, trace)
    end
    rows[#rows + 1] = row or {'refused', err.err}
  end
  return rows
end

return flushed(main)
