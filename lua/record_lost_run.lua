-- record_lost_run: keep the record of a run whose own record vanished before its time, and
-- count the loss in its job's tallies, once per loss: a run with a record here is counted
-- again only when that record says the tick made the run again since; otherwise the record
-- of the same loss is replaced (what the tick does about it may change: a run it began to
-- make again and could not finish making may be named lost at a later tick).
--
-- KEYS[1] tallies: hash, the job's counters (finished:<state>, missed, lost)
-- KEYS[2] lost: hash, the job's lost runs, run id -> its record (JSON)
-- ARGV[1] the run id (id)
-- ARGV[2] the lost run's record (json, bound json_bytes)
--
-- Returns: 1 when the record was written and the loss counted now, 0 when counted before
--   (the record replaced)
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'tallies', 'hash'}, {'lost', 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id'}, {2, 'json', 'json_bytes'}})
  if bad then return bad end
  local seen = rcall('HGET', KEYS[2], A[1])
  if seen then
    local ok, old = pcall(cjson.decode, seen)
    if ok and type(old) == 'table' and (tonumber(old['rerun_at_ms']) or 0) == 0 then
      rcall('HSET', KEYS[2], A[1], A[2])
      return 0
    end
  end
  rcall('HSET', KEYS[2], A[1], A[2])
  rcall('HINCRBY', KEYS[1], 'lost', 1)
  return 1
end

return main()
