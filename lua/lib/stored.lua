-- Numbers and timelines read back from Redis ("-- @include stored"; texts, names and failure records are in
-- "-- @include stored_text", which needs this file above it: the update script, the hottest, defines only what it
-- uses, as a script re-creates every function it includes at each call): the accept/reject rules of
-- kvstatus/replies.py, which the tests hold to these functions value by value. Every stored value a script reads
-- goes through one of them; a value they refuse is one kvstatus never writes (a tenant's HSET, a bug), and each
-- script says what it does then.
-- Anchored patterns and length checks first: a tenant's 1 MiB value costs one comparison.

local STORED_MAX_INT = 999999999999999  -- 15 digits: epochs, stamps, lease deadlines
local STORED_MAX_TIME = 253402300799999  -- Unix ms of 9999-12-31T23:59:59.999Z, the last a reader can show

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
