-- cut_leases: ends now every lease one owner holds in a shard, because its worker stopped
-- sending heartbeats (killed, powered off, or cut off from Redis alone). Each lease's expiry
-- becomes now, so the next claim takes it over as it takes over any expired lease: a new
-- token, the attempt counted, dead after the last attempt. The old holder is refused from
-- now on, by the server clock, whatever its own clock says. It walks the shard's live leases (the `leases` index after now) in order of expiry, from
-- a cursor, looking at about N of them per call (a run of leases sharing one expiry is
-- looked at whole); the caller calls again from the cursor returned until it is ''. Every
-- lease of the owner is found: an owner that stopped renews nothing, so its leases stay
-- where the walk has still to go, and a cut lease leaves the range.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead (see include/shard_keys.lua)
-- ARGV[1] owner: the worker name its claims gave (id)
-- ARGV[2] N, about the most leases to look at in this call (int, bound sweep)
-- ARGV[3] cursor (text, bound text_bytes): '' to start, else the cursor an earlier call
--   returned: an expiry in ms, inclusive, or '(' and one, exclusive
--
-- Counters: leases_cut (leases ended early), lost (index entries whose record vanished, dropped).
-- Returns: {leases cut, now ms, cursor: '' when the walk is done, else where the next call starts}
-- Errors: INVALID <what>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"

-- The lowest expiry of the walk: `cursor` (its form checked), never at or before now.
local function walk_from(cursor, now)
  if cursor == '' then return '(' .. now end
  local open, digits = cursor:match('^(%(?)(%d+)$')
  local at = digits and #digits <= 15 and tonumber(digits)
  if not at or at > LIMITS.bounds.time_ms[2] then return nil end
  if at <= now then return '(' .. now end
  return open .. digits
end

local function main()
  local bad = check_keys(SHARD_KEYS)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'sweep'}, {3, 'text', 'text_bytes', ''}})
  if bad then return bad end
  local owner, limit = A[1], A[2]
  local now = now_ms()
  local from = walk_from(A[3], now)
  if not from then
    return fail('INVALID', 'ARGV[3] must be \'\' or an expiry in ms, maybe after \'(\'')
  end
  local page = rcall('ZRANGEBYSCORE', LEASES, from, '+inf', 'WITHSCORES', 'LIMIT', 0, limit)
  local ids, cursor = {}, ''
  for i = 1, #page, 2 do ids[#ids + 1] = page[i] end
  if #ids == limit then
    local first, last = page[2], page[#page]
    if first == last then  -- one expiry fills the page: take all that share it
      ids = rcall('ZRANGEBYSCORE', LEASES, last, last)
      cursor = '(' .. last
    else  -- the next call looks at the last expiry again, whole
      cursor = last
      local whole = {}
      for i = 1, #page, 2 do
        if page[i + 1] ~= last then whole[#whole + 1] = page[i] end
      end
      ids = whole
    end
  end
  prefetch(ids)
  local cut = 0
  for _, id in ipairs(ids) do
    local rec = load(id)
    if not rec then
      drop_orphan(id)
    elseif rec.state == 'leased' and rec.owner == owner and not lease_expired(rec, now) then
      bad = put(id, rec, 'leased', now)
      if bad then return bad end
      cut = cut + 1
    end
  end
  if cut > 0 then bump('leases_cut', cut) end
  return {cut, now, cursor}
end

return flushed(main)
