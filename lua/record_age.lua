-- record_age: add a sample to a run's series of its oldest eligible age. None is added once
-- the run is final or its record is gone, nor within the least interval of the last sample;
-- the series takes the record's time to live, so it never outlives the run.
--
-- KEYS[1] run: hash, the run's record (tag {<run_id>})
-- KEYS[2] ages: stream, the run's samples, each at, age, done, unfinished (same tag)
-- ARGV[1] the sample's time, ms (int, bound time_ms)
-- ARGV[2] the least time between two samples, ms (int, bound ttl_ms)
-- ARGV[3] the samples kept, about (int, bound cap)
-- ARGV[4] the oldest eligible age, seconds (num, bound tally)
-- ARGV[5] items done (int, bound tally)
-- ARGV[6] items unfinished (int, bound tally)
--
-- Returns: 1 when added; 0 when the run is final or gone, or the last sample is too recent
-- Errors: INVALID <what>
-- @include "protocol.lua"

local KEYS_TAKEN = {{'', 'hash'}, {'ages', 'stream'}}

local function main()
  local bad = check_keys(KEYS_TAKEN)
  if bad then return bad end
  local A
  A, bad = check_args({{1, 'int', 'time_ms'}, {2, 'int', 'ttl_ms'}, {3, 'int', 'cap'},
    {4, 'num', 'tally'}, {5, 'int', 'tally'}, {6, 'int', 'tally'}})
  if bad then return bad end
  local state = rcall('HGET', KEYS[1], 'state')
  if not check_value('one', LIMITS.run_states.open, state) then return 0 end  -- final or gone
  local last = rcall('XREVRANGE', KEYS[2], '+', '-', 'COUNT', 1)[1]
  if last then
    local fields = last[2]
    for i = 1, #fields, 2 do
      if fields[i] == 'at' and math.abs(A[1] - (tonumber(fields[i + 1]) or 0)) < A[2] then
        return 0
      end
    end
  end
  rcall('XADD', KEYS[2], 'MAXLEN', '~', A[3], '*', 'at', ARGV[1], 'age', ARGV[4],
    'done', ARGV[5], 'unfinished', ARGV[6])
  local ttl = rcall('PTTL', KEYS[1])
  if ttl > 0 then rcall('PEXPIRE', KEYS[2], ttl) end
  return 1
end

return main()
