-- settle: many holder operations on one shard's items in one call (commits, failures,
-- releases, renewals), each fenced on its own, as if each were sent alone in this
-- order (an item may appear more than once). One refusal refuses only its own entry.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard.lua)
-- ARGV[1...] groups of operation: commit|fail|release|renew (id), item id (id), token (int, bound token), lease id or '' (id?), detail (text, bound json_bytes), option (text, bound text_bytes); at most batch groups
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
-- Returns: one row per group, in order:
--   commit   {'committed' | 'repeated', token, result, done_at ms}
--   fail     {'retry' | 'dead', eligible_at ms (0 when dead), attempts, now ms}
--   release  {'released', now ms}
--   renew    {'renewed', expires_at ms, now ms}
--   refused  {'refused', 'NOT_FOUND item=<id>' | 'LEASE_LOST item=<id> token=<t> current_token=<t>
--            state=<s> reason=<r> expires_at=<ms>'}
-- Errors: INVALID <what> (any bad argument: nothing is written)
-- @include "shard.lua"
-- @include "holder.lua"

-- Each operation's kinds of detail and option (after the id, id, token, id? every group has).
local KINDS = {
  commit = {{'json', 'json_bytes'}, {'id?'}},
  fail = {{'text', 'error_bytes'}, false},
  release = {{'int', 'delay_ms'}, {'one', {''}}},
  renew = {{'int', 'ttl_ms'}, {'one', {''}}},
}

-- Checks the groups ARGV[1...] in one pass; returns them as lists, or nil and an INVALID reply.
local function check_groups()
  if #ARGV % 6 ~= 0 then return nil, fail('INVALID', 'ARGV[1...] must come in groups of 6') end
  if #ARGV / 6 > LIMITS.bounds.batch[2] then
    return nil, fail('INVALID', 'at most ' .. LIMITS.bounds.batch[2] .. ' per call')
  end
  local groups = {}
  for i = 1, #ARGV, 6 do
    local op = ARGV[i]
    local kinds = KINDS[op]
    if not kinds then
      return nil, fail('INVALID', 'ARGV[' .. i .. '] must be one of commit, fail, release, renew')
    end
    local id, why = check_value('id', nil, ARGV[i + 1])
    if not id then return nil, fail('INVALID', 'ARGV[' .. (i + 1) .. '] ' .. why) end
    local token
    token, why = check_value('int', 'token', ARGV[i + 2])
    if not token then return nil, fail('INVALID', 'ARGV[' .. (i + 2) .. '] ' .. why) end
    local lease_id
    lease_id, why = check_value('id?', nil, ARGV[i + 3])
    if not lease_id then return nil, fail('INVALID', 'ARGV[' .. (i + 3) .. '] ' .. why) end
    local raw = ARGV[i + 4]
    if op == 'release' and raw == '' then raw = '0' end
    local detail
    detail, why = check_value(kinds[1][1], kinds[1][2], raw)
    if detail == nil then return nil, fail('INVALID', 'ARGV[' .. (i + 4) .. '] ' .. why) end
    local option = ARGV[i + 5]
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
    groups[#groups + 1] = {op, id, token, lease_id, detail, option}
  end
  return groups
end

local function main()
  local bad = check_keys(7, false, SHARD_KEYS)
  if bad then return bad end
  local groups
  groups, bad = check_groups()
  if bad then return bad end
  local ids = {}
  for g, group in ipairs(groups) do ids[g] = group[2] end
  local now = now_ms()
  prefetch(ids)
  local rows = {}
  for _, g in ipairs(groups) do
    local op, id, token, lease_id, detail, option = g[1], g[2], g[3], g[4], g[5], g[6]
    local row, err
    if op == 'commit' then
      row, err = do_commit(id, token, lease_id, detail, option, now)
    elseif op == 'fail' then
      row, err = do_fail(id, token, lease_id, detail, option == 'permanent', tonumber(option) or 0, now)
    elseif op == 'release' then
      row, err = do_release(id, token, lease_id, detail, now)
    else
      row, err = do_renew(id, token, lease_id, detail, now)
    end
    rows[#rows + 1] = row or {'refused', err.err}
  end
  flush()
  return rows
end

return main()
