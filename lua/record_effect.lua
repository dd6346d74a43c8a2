-- record_effect: write an item's effect record under the fence, in the same
-- script as the holder check. States: intended (before the external call) ->
-- applied (with the provider's reference) | failed (definite) | unknown
-- (timeout, reset, 5xx after sending). An applied record is final. In a shard marked
-- after_loss (close_shard ARGV[3]: its run was made again after a loss of data, or lived
-- through one) the ledger may have gone with the loss: with ARGV[8] '1', an effect with no
-- record may have been applied, so it is written unknown (its error says why; after_loss
-- true until its next write) and returned as an open one, {'unknown', record, key, 0},
-- for the caller to reconcile before anything is sent.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- KEYS[9] effects: hash, idempotency key -> JSON record
-- KEYS[10] effects_unknown: zset, the unknown effects, idempotency key -> since (ms)
-- ARGV[1] item id (id)
-- ARGV[2] token (int, bound token)
-- ARGV[3] lease id, '' to check the token alone (id?)
-- ARGV[4] idempotency key (text, bound key_length)
-- ARGV[5] effect name (id)
-- ARGV[6] new state (one of intended|applied|failed|unknown)
-- ARGV[7] detail: the provider's result when applied, the error otherwise (json, bound json_bytes)
-- ARGV[8] '1': record an intent only when no attempt is open (one of 1|0|''), default ''
--   (with '1' a record that is intended or unknown is returned unchanged, and an applied
--   one is returned without the holder check: it is final)
-- ARGV[9] an earlier key of the effect, '' for none (text, bound key_length): used instead
--   of ARGV[4] when ARGV[4] has no record and it holds this item's effect of this name
-- ARGV[10] optional trace id of the attempt, logged with a refusal (id?), default ''
-- ARGV[11] optional TTL in ms (int, bound ttl_ms), default '': when the call writes
--   intended, the lease is renewed for this long from now in the same call (the check
--   right before the provider call: a takeover can then come only during the call itself)
--
-- Counters: effects_<state> (records now in each state), effects_reconciled
-- (applied after an unknown or another token's intent), renewals (leases renewed).
-- Log: a refusal (LEASE_LOST) only.
-- Returns: {previous state ('' when new), the stored record (JSON), the key used, the
--   lease's expiry in ms when it was renewed (ARGV[11]) else 0}; when the record is
--   already applied (or, with ARGV[8] '1', open) it is returned unchanged.
-- Errors: INVALID <what>; NOT_FOUND item=<id>;
--   LEASE_LOST item=<id> token=<t> current_token=<t> state=<s> reason=<r> expires_at=<ms>
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "items.lua"
-- @include "holder_check.lua"

local EFFECTS, UNKNOWN = KEYS[9], KEYS[10]
local KEYS_TAKEN = keys_with(LOGGED_KEYS, {{'effects', 'hash'}, {'effects_unknown', 'zset'}})
local FROM = {intended = {[''] = true, intended = true, unknown = true, failed = true},
  applied = {intended = true, unknown = true}, failed = {intended = true, unknown = true},
  unknown = {intended = true}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'token'}, {3, 'id?'}, {4, 'text', 'key_length'},
    {5, 'id'}, {6, 'one', {'intended', 'applied', 'failed', 'unknown'}}, {7, 'json', 'json_bytes'},
    {8, 'one', {'1', '0', ''}, ''}, {9, 'text', 'key_length', ''}, {10, 'id?', nil, ''},
    {11, 'int', 'ttl_ms', false}})
  if bad then return bad end
  if A[4] == '' then return fail('INVALID', 'ARGV[4] must be an idempotency key') end
  local id, token, lease_id = A[1], A[2], A[3]
  local key, name, state, detail = A[4], A[5], A[6], A[7]
  local now = now_ms()
  local raw = rcall('HGET', EFFECTS, key)
  if not raw and A[9] ~= '' then
    local old = rcall('HGET', EFFECTS, A[9])
    local ok, found = pcall(cjson.decode, old or '')
    if ok and type(found) == 'table' and found.item == id and found.name == name then
      key, raw = A[9], old
    end
  end
  local rec = raw and cjson.decode(raw) or {item = id, name = name, state = ''}
  -- An applied record is final: read under ARGV[8] '1' without the fence, as a plain read would.
  if rec.state == 'applied' and A[8] == '1' then return {'applied', raw, key, 0} end
  local item, err = held(id, token, lease_id, now, 'stale_effects', nil, A[10])
  if err then return err end
  if rec.state == 'applied' then return {'applied', raw, key, 0} end
  local begin = A[8] == '1' and state == 'intended'
  if begin and (rec.state == 'intended' or rec.state == 'unknown') then
    return {rec.state, raw, key, 0}
  end
  if begin and rec.state == '' and rcall('HGET', META, 'after_loss') == '1' then
    -- No record, but the ledger may have gone with a loss of data: it may have been applied.
    rec.state, rec.token, rec.updated_at, rec.after_loss = 'unknown', token, now, true
    rec.error = cjson.encode('no record, but the run was made again after a loss of data (or '
      .. 'lived through one) and its ledger may have gone with it: it may have been applied')
    bump('effects_unknown')
    rcall('ZADD', UNKNOWN, 'NX', now, key)
    local text = cjson.encode(rec)
    rcall('HSET', EFFECTS, key, text)
    return {'unknown', text, key, 0}
  end
  if not FROM[state][rec.state] then
    return fail('INVALID', 'effect ' .. key .. ' cannot go from ' .. rec.state .. ' to ' .. state)
  end
  local expires = 0
  if state == 'intended' and A[11] then  -- the check right before the call renews the lease
    err = put(id, item, 'leased', now + A[11])
    if err then return err end
    bump('renewals')
    expires = item.expires_at
  end
  local previous = rec.state
  if state == 'applied' and (previous == 'unknown' or rec.token ~= token) then
    bump('effects_reconciled')  -- an earlier attempt's outcome, resolved by this one
  end
  if previous ~= '' then bump('effects_' .. previous, -1) end
  bump('effects_' .. state)
  if state == 'unknown' then rcall('ZADD', UNKNOWN, 'NX', now, key) else rcall('ZREM', UNKNOWN, key) end
  rec.state, rec.token, rec.updated_at, rec.after_loss = state, token, now, nil
  if state == 'intended' then rec.attempts = (rec.attempts or 0) + 1 end
  if state == 'applied' then rec.result = detail elseif state ~= 'intended' then rec.error = detail end
  local text = cjson.encode(rec)
  rcall('HSET', EFFECTS, key, text)
  return {previous, text, key, expires}
end

return flushed(main)
