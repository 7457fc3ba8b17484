-- Texts, names and failure records read back from Redis ("-- @include stored_text", after "-- @include stored"):
-- the accept/reject rules of kvstatus/replies.py, as in lua/lib/stored.lua.

local STORED_MAX_TEXT = 2048  -- bytes of a reason (kvstatus.keys.MAX_REASON_BYTES)
local STORED_MAX_NAME = 128  -- bytes of a participant or origin name (kvstatus.keys.MAX_NAME_LENGTH)
local STORED_STAGES = {bootstrap = true, waiting = true, transfer = true, ["lease-lost"] = true,
  superseded = true, cancelled = true}

-- Whether `value` is a participant or origin name: 1..128 of A-Z a-z 0-9 _ . -
local function stored_name(value)
  return type(value) == "string" and #value <= STORED_MAX_NAME and string.find(value, "^[%w_.%-]+$") ~= nil
end

-- Whether `value` is UTF-8 text (no overlong form, no surrogate, nothing above U+10FFFF), as Python decodes it.
local function utf8_text(value)
  if not string.find(value, "[\128-\255]") then
    return true
  end
  local byte, i, n = string.byte, 1, #value
  while i <= n do
    local c = byte(value, i)
    if c < 128 then
      i = i + 1
    else
      local len, low, cp
      if c >= 194 and c <= 223 then
        len, low, cp = 2, 128, c - 192
      elseif c >= 224 and c <= 239 then
        len, low, cp = 3, 2048, c - 224
      elseif c >= 240 and c <= 244 then
        len, low, cp = 4, 65536, c - 240
      else
        return false
      end
      if i + len - 1 > n then
        return false
      end
      for k = i + 1, i + len - 1 do
        local d = byte(value, k)
        if d < 128 or d > 191 then
          return false
        end
        cp = cp * 64 + d - 128
      end
      if cp < low or cp > 1114111 or (cp >= 55296 and cp <= 57343) then
        return false
      end
      i = i + len
    end
  end
  return true
end

-- Whether `value` is a reason kvstatus stores: UTF-8 text of at most 2048 bytes.
local function stored_text(value)
  return type(value) == "string" and #value <= STORED_MAX_TEXT and utf8_text(value)
end

-- The stage and origin of a room's failure record "<ms>:<stage>:<origin>:<reason>" (lua/lib/fate.lua), or nil
-- when `value` is not one: ms a stored_time, a known stage, origin 1..128 bytes (no colon: the split ends it;
-- kvstatus writes a name there, readers escape what they show), reason at most 2048 bytes.
local function stored_fate(value)
  if type(value) ~= "string" or #value > 2400 then  -- longer than any record: 15 + 10 + 128 + 2048 + 3
    return nil
  end
  local ms, stage, origin, reason = string.match(value, "^([^:]*):([^:]*):([^:]*):(.*)$")
  if not ms or not stored_time(ms) or not STORED_STAGES[stage] or #origin < 1 or #origin > STORED_MAX_NAME
      or #reason > STORED_MAX_TEXT then
    return nil
  end
  return stage, origin
end
