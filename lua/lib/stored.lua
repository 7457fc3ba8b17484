-- Values read back from Redis ("-- @include stored"): the accept/reject rules of kvstatus/stored.py, which the
-- tests hold to these functions value by value. Every stored value a script reads goes through one of them; a
-- value they refuse is one kvstatus never writes (a tenant's HSET, a bug), and each script says what it does then.
-- Anchored patterns and length checks first: a tenant's 1 MiB value costs one comparison.

local STORED_MAX_INT = 999999999999999  -- 15 digits: epochs, stamps, lease deadlines
local STORED_MAX_TIME = 253402300799999  -- Unix ms of 9999-12-31T23:59:59.999Z, the last a reader can show
local STORED_MAX_TEXT = 2048  -- bytes of a reason (kvstatus.operations.MAX_REASON_BYTES)
local STORED_MAX_NAME = 128  -- bytes of a participant or origin name (kvstatus.keys.MAX_NAME_LENGTH)
local STORED_STAGES = {bootstrap = true, waiting = true, transfer = true, ["lease-lost"] = true,
  superseded = true, cancelled = true}

-- `value` as a number if it is a positive integer of 1..15 decimal digits (no sign, space, exponent, hex,
-- leading zero, inf or nan), else nil: an epoch, an entry's stamp, a lease deadline.
local function stored_int(value)
  if type(value) ~= "string" or #value > 15 or not string.find(value, "^[1-9][0-9]*$") then
    return nil
  end
  return tonumber(value)
end

-- `value` as Unix ms if it is a stored_int no later than year 9999, else nil: a failure record's time.
local function stored_time(value)
  local ms = stored_int(value)
  if ms and ms <= STORED_MAX_TIME then
    return ms
  end
  return nil
end

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

-- The base (Unix ms) and the last offset of a timeline (lua/lib/timeline.lua's format), or nil when `value`
-- is not one: at most `max_bytes`, each number 1..15 digits, offsets that never go back. (The update's hot
-- path: one anchored find, then one gmatch step per step; the steps found must tile the rest of the value.)
local function stored_timeline(value, max_bytes)
  if type(value) ~= "string" or #value > max_bytes then
    return nil
  end
  local _, head = string.find(value, "^[0-4]@[1-9][0-9]*")
  if not head or head > 17 then  -- 2 + 15 digits
    return nil
  end
  local last, covered, byte = 0, head, string.byte
  for offset in string.gmatch(value, " [0-4]%+([0-9]+)") do
    local digits = #offset
    if digits > 15 or (digits > 1 and byte(offset) == 48) then  -- 48: a leading "0"
      return nil
    end
    local at = tonumber(offset)
    if at < last then
      return nil
    end
    last, covered = at, covered + 3 + digits
  end
  if covered ~= #value then  -- something between or after the steps that is not one
    return nil
  end
  return tonumber(string.sub(value, 3, head)), last
end
