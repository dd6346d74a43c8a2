-- observe_data_set: one tick of a job reads and raises the data set's mark. It notices a
-- loss of data by comparing the mark with what the scheduler remembers and with the job
-- record's copy of the id:
--   replaced     another id is remembered, or one is while there is no mark and no copy
--   rolled_back  the same id, but the mark's seq is below the one remembered
--   mark_lost    no mark while the job's record keeps its id (the mark is made again)
-- Each loss is counted once, by whichever scheduler notices it first: noticing moves the
-- epoch on, and a scheduler that remembers an older epoch (or the replaced id) takes the
-- new one.
--
-- KEYS[1] mark: hash, the data set's mark (id, created_at, epoch, seq, losses); <prefix>:dataset
-- ARGV[1] the id the scheduler remembers, '' for none (id?)
-- ARGV[2] the epoch it remembers (int, bound tally)
-- ARGV[3] the seq it remembers (int, bound tally)
-- ARGV[4] the job record's copy of the id, '' for none (id?)
-- ARGV[5] the id of a mark made now (id)
--
-- Returns: {id, epoch, seq after this tick's, the kind of loss noticed now or '',
--   the id the loss concerns or '', 1 when a loss happened since what was remembered
--   else 0, created_at ms}
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{false, 'hash'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'id?'}, {2, 'int', 'tally'}, {3, 'int', 'tally'}, {4, 'id?'},
    {5, 'id'}})
  if bad then return bad end
  local m = KEYS[1]
  local rid, repoch, rseq, copy = A[1], ARGV[2], A[3], A[4]
  local now = now_ms()
  local id = rcall('HGET', m, 'id')
  local kind, previous, since = '', '', 0
  if not id then
    if copy ~= '' then
      id, kind, previous = copy, 'mark_lost', copy
    else
      id = A[5]
      if rid ~= '' then kind, previous = 'replaced', rid end
    end
    rcall('HSET', m, 'id', id, 'created_at', now, 'epoch', 0, 'seq', 0)
  elseif rid ~= '' and id ~= rid then
    if rcall('HGET', m, 'replaces') == rid then
      since = 1
    else
      kind, previous = 'replaced', rid
    end
  elseif rid ~= '' then
    if (rcall('HGET', m, 'epoch') or '0') ~= repoch then
      since = 1
    elseif (tonumber(rcall('HGET', m, 'seq')) or 0) < rseq then
      kind, previous = 'rolled_back', id
    end
  end
  if kind ~= '' then
    since = 1
    if kind == 'replaced' then rcall('HSET', m, 'replaces', rid) end
    rcall('HINCRBY', m, 'epoch', 1)
    rcall('HINCRBY', m, 'losses:' .. kind, 1)
    rcall('HSET', m, 'last_loss', kind, 'last_loss_at', now)
  end
  local seq = rcall('HINCRBY', m, 'seq', 1)
  local epoch = tonumber(rcall('HGET', m, 'epoch')) or 0
  return {id, epoch, seq, kind, previous, since, tonumber(rcall('HGET', m, 'created_at')) or now}
end

return main()
