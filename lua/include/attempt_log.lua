-- The attempt log (KEYS[8] attempts): one entry per ended attempt, staged with the call's
-- other writes and sent by flush (staged.lua). An entry's fields, in order:
--   item, attempt, token, event, queue_ms, run_ms, worker, trace, error, label
-- event: committed | retry | dead | released (the holder ended the attempt), takeover (a claim
-- took over its expired lease), expired (reap made it pending again), refused (a holder
-- call refused with LEASE_LOST: token is the caller's, error the refusal's detail, attempt,
-- worker and times ''). queue_ms: eligible_at to leased_at (the wait before the claim);
-- run_ms: leased_at to the entry; trace: the trace id the holder sent ('' for takeover and
-- expired); error: the failure's text; label: a commit's outcome label. A field without a
-- value is ''. The entry id is its time.
-- @include "numbers.lua"
-- @include "staged.lua"

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
