-- The keys of a shard, by name, and their types: every shard script includes this.
--
-- Shard keys (all share the hash tag {<run_id>#<shard>}; each script checks their names and
-- types with check_keys, SHARD_KEYS or LOGGED_KEYS below, before its first write):
--   KEYS[1] meta     hash: run, shard, max_attempts, backoff_base_ms, backoff_cap_ms,
--                    deadline_at (ms, 0 = none), closed (read by shard_meta.lua);
--                    after_loss ('1': its effect ledger may have been lost; read by
--                    record_effect, set by close_shard)
--   KEYS[2] counts   hash: done and the event counters (pending, leased, dead: ZCARD of due,
--                    leases, dead); added, lost and late_commits keep a run's accounting
--   KEYS[3] items    hash: <item id> -> the packed record, <item id>#r -> result JSON,
--                    <item id>#e -> its last errors (the forms: record.lua)
--   KEYS[4] due      zset: pending items by eligible-at (ms)
--   KEYS[5] leases   zset: leased items by lease expiry (ms)
--   KEYS[6] held     zset: leased items by lease start (ms)
--   KEYS[7] dead     zset: dead items by time of death (ms)
--   KEYS[8] attempts stream: the attempt log, capped with XADD MAXLEN ~ attempt_log
--                    (limits.json); only the scripts that end attempts take it (claim,
--                    claim_next, renew, commit, fail, release, settle, reap, record_effect).
--                    One entry per ended attempt, written in the same call as the change
--                    (its fields: attempt_log.lua)
-- @include "protocol.lua"
local META, COUNTS, ITEMS, DUE, LEASES, HELD, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local ATTEMPTS = KEYS[8]  -- the attempt log, in the scripts that take LOGGED_KEYS
local INDEX = {pending = DUE, leased = LEASES, dead = DEAD}
-- The shard's keys with their types, as check_keys takes them: SHARD_KEYS, and LOGGED_KEYS
-- (with the attempt log) for the scripts that end attempts.
local SHARD_KEYS = {{'meta', 'hash'}, {'counts', 'hash'}, {'items', 'hash'}, {'due', 'zset'},
  {'leases', 'zset'}, {'held', 'zset'}, {'dead', 'zset'}}
local LOGGED_KEYS = keys_with(SHARD_KEYS, {{'attempts', 'stream'}})
