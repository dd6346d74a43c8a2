-- An item's record: its packed form in the items hash, decoded and encoded here only.
--
-- KEYS[3] items holds <item id> -> the record, packed as
--     state|token|attempts|lease id|owner|leased_at|expires_at|done_at|outcome|late|eligible_at|payload
--   (times in ms; '' = none; eligible_at: when the item last became claimable, its due score
--   as put or the expiry of the lease a claim took over; the payload is the JSON text as
--   given, last, copied and never decoded here), and beside it <item id>#r -> result JSON,
--   <item id>#e -> its last errors. '#' is in no id. <item id>#e holds a JSON array of the
--   last error_history (limits.json) errors, oldest first, each {"error": text, "attempt": n,
--   "at": ms, "trace": id}. Release 0.9.0 writes the same form.
-- @include "numbers.lua"

local RESULT, ERROR = '#r', '#e'  -- the suffixes of an item's result and errors fields
-- The packed form's twelve fields.
local RECORD = '^(%l+)|(%d*)|(%d*)|([^|]*)|([^|]*)|(%d*)|(%d*)|(%d*)|([^|]*)|(%d*)|(%d*)|(.*)$'

-- A packed record as a table, nil when it is not of the form above.
local function decode(raw)
  local s, tok, att, lid, own, lat, exp, don, out, late, elig, payload = raw:match(RECORD)
  if not s then return nil end
  return {state = s, token = tonumber(tok), attempts = tonumber(att),
    lease_id = lid ~= '' and lid or nil, owner = own ~= '' and own or nil,
    leased_at = number_of(lat), expires_at = number_of(exp), done_at = number_of(don),
    outcome = out ~= '' and out or nil, late = late == '1' or nil,
    eligible_at = number_of(elig), payload = payload ~= '' and payload or nil}
end

-- One concatenation (Lua joins the whole chain at once; no table to build).
local function encode(rec)
  return rec.state .. '|' .. num(rec.token) .. '|' .. num(rec.attempts) .. '|'
    .. (rec.lease_id or '') .. '|' .. (rec.owner or '') .. '|' .. num(rec.leased_at) .. '|'
    .. num(rec.expires_at) .. '|' .. num(rec.done_at) .. '|' .. (rec.outcome or '') .. '|'
    .. (rec.late and '1' or '') .. '|' .. num(rec.eligible_at) .. '|' .. (rec.payload or '')
end
