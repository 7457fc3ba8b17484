-- Test probe (tests/core/test_stored_values.py): lua/lib/stored.lua's verdict on ARGV[2] by the rule ARGV[1].
-- Returns the parsed value as a string, or nil when the rule refuses the value.
local SCRIPT = "stored_probe"

-- @include stored
-- @include stored_text

local kind, value = ARGV[1], ARGV[2]
if kind == "int" then
  local n = stored_int(value)
  return n and string.format("%.0f", n) or false
elseif kind == "time" then
  local n = stored_time(value)
  return n and string.format("%.0f", n) or false
elseif kind == "text" then
  return stored_text(value) and "ok" or false
elseif kind == "name" then
  return stored_name(value) and "ok" or false
elseif kind == "fate" then
  local stage, origin = stored_fate(value)
  return stage and (stage .. " " .. origin) or false
elseif kind == "timeline" then
  local base, last = stored_timeline(value, 160)
  return base and string.format("%.0f %.0f", base, last) or false
end
return redis.error_reply("unknown kind " .. tostring(kind))
