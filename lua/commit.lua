-- commit: the holder marks its item done with a result, optionally applying
-- guarded writes atomically with the fence. Repeating a commit with the same
-- token and lease id returns the stored outcome and writes nothing. A commit
-- after the shard's deadline is accepted (its lease was granted before) and
-- counted in late_commits.
--
-- KEYS[1] meta, KEYS[2] counts, KEYS[3] items, KEYS[4] due,
-- KEYS[5] leases, KEYS[6] held, KEYS[7] dead, KEYS[8] attempts (see include/shard_keys.lua)
-- KEYS[9...] guarded: any type, the guarded keys, referred to by number from 1 in ARGV[5] and
--   ARGV[6]; each write checks the type it needs first (their rules: include/guards.lua)
-- ARGV[1] item id (id)
-- ARGV[2] token (int, bound token)
-- ARGV[3] lease id, '' to check the token alone (id?)
-- ARGV[4] result (json, bound json_bytes)
-- ARGV[5] conditions, a JSON array, '[]' for none (text, bound json_bytes)
-- ARGV[6] writes, a JSON array, '[]' for none (text, bound json_bytes)
-- ARGV[7] optional outcome label, counted as outcome_<label> (id?)
-- ARGV[8] optional trace id of the attempt, logged (id?), default ''
--
-- Counters: commits, outcome_<label>, late_commits, stale_commits (refused).
-- Log: committed (not a repeated commit), or a refusal (LEASE_LOST); a failed condition
--   logs nothing.
-- Returns: {'committed' | 'repeated', token, result, done_at ms} (a repeated commit's
--   result is '' when it was null). settle.lua commits many items of a shard in one call.
-- Errors: INVALID <what>; NOT_FOUND item=<id>;
--   LEASE_LOST item=<id> token=<t> current_token=<t> state=<s> reason=<r> expires_at=<ms>;
--   CONDITION_FAILED item=<id> condition=<n> (1-based; nothing was written)
-- @include "protocol.lua"
-- @include "shard_keys.lua"
-- @include "staged.lua"
-- @include "holder.lua"
-- @include "guards.lua"

local function main()
  local bad = check_keys(LOGGED_KEYS, true)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'int', 'token'}, {3, 'id?'}, {4, 'json', 'json_bytes'},
    {5, 'text', 'json_bytes'}, {6, 'text', 'json_bytes'}, {7, 'id?', nil, ''}, {8, 'id?', nil, ''}})
  if bad then return bad end
  local id, token, lease_id, result = A[1], A[2], A[3], A[4]
  local conditions, why = decode_specs(A[5], 'guarded conditions')
  local writes
  if conditions then writes, why = decode_specs(A[6], 'guarded writes') end
  if not writes then return fail('INVALID', why) end
  why = check_guards(conditions, writes)
  if why then return fail('INVALID', why) end
  local function guarded()
    for i, c in ipairs(conditions) do
      if not condition_holds(c) then
        return fail('CONDITION_FAILED', 'item=' .. id .. ' condition=' .. i)
      end
    end
    local bad_type = check_types(writes)
    if bad_type then return fail('INVALID', bad_type) end
    return nil
  end
  local row, err = do_commit(id, token, lease_id, result, A[7], now_ms(), guarded, A[8])
  if row and row[1] == 'committed' then
    for _, w in ipairs(writes) do apply(w) end
  end
  if not row then return err end
  return row
end

return flushed(main)
