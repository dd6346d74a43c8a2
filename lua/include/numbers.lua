-- Numbers and their texts, each converted once per call: the items of a batch share their
-- times, and a time read from a record keeps its text for the record's next encoding.

-- A number as its text ('' for none).
local number_texts = {}
local function num(n)
  if not n then return '' end
  local s = number_texts[n]
  if not s then s = tostring(n); number_texts[n] = s end
  return s
end

-- A time field of a record ('' for none) as a number, its text kept for num(); each text
-- converted once per call (the records of a batch share their times).
local text_numbers = {}
local function number_of(text)
  if text == '' then return nil end
  local n = text_numbers[text]
  if n then return n end
  n = tonumber(text)  -- the field is digits only: its text is tostring's unless it is
  if n and n < 1e14 and (#text == 1 or text:byte(1) ~= 48) then  -- long or starts with 0
    number_texts[n] = text
    text_numbers[text] = n
  end
  return n
end
