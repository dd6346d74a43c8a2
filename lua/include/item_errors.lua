-- An item's last errors (<item id>#e, record.lua): the newest added, the oldest dropped.
-- @include "record.lua"
-- @include "items.lua"

-- Sets `text` as the item's newest error: <id>#e keeps the last error_history errors.
local function set_error(id, rec, text, now, trace)
  local errors = {}
  local old = text_of(id, ERROR)
  if old then
    local ok, list = pcall(cjson.decode, old)
    if ok and type(list) == 'table' then errors = list end
  end
  errors[#errors + 1] = {error = text, attempt = rec.attempts, at = now,
    trace = trace ~= '' and trace or nil}
  local kept = {}
  for i = math.max(1, #errors - LIMITS.defaults.error_history + 1), #errors do
    kept[#kept + 1] = errors[i]
  end
  rec.set_error = cjson.encode(kept)
end
