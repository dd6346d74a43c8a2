-- An item's last errors (<item id>#e, record.lua): the newest added, the oldest dropped.
-- @include "record.lua"
-- @include "items.lua"

-- Sets `text` as the item's newest error: <id>#e keeps the last error_history errors.
local function set_error(id, rec, text, now, trace)
  local errors = {}
  local old = rec.set_error or text_of(id, ERROR)  -- set_error: an earlier JSON record's error
  if old then
    local ok, list = false, nil
    if old:sub(1, 2) == '[{' then ok, list = pcall(cjson.decode, old) end
    if ok and type(list) == 'table' and type(list[1]) == 'table'
        and type(list[1].error) == 'string' then
      errors = list
    else
      errors = {{error = old}}  -- an earlier version's one error text
    end
  end
  errors[#errors + 1] = {error = text, attempt = rec.attempts, at = now,
    trace = trace ~= '' and trace or nil}
  local kept = {}
  for i = math.max(1, #errors - LIMITS.defaults.error_history + 1), #errors do
    kept[#kept + 1] = errors[i]
  end
  rec.set_error = cjson.encode(kept)
end
