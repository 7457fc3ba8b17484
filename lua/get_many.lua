#!lua flags=no-writes
-- Read one participant's status from each room hash in KEYS, in one command.
-- Read-only (the flag above), so Redis >= 7 may run it on a replica and during OOM.
--
-- KEYS[i]  room hash of the i-th room. Not checked to belong together (lua/lib/keys.lua), unlike the
--          keys of the other scripts of many keys: this one writes nothing, each key's answer is that key's own
--          HGET, which the ACL allows or not, and the check would add 15-30 % to its Redis time.
-- ARGV[1]  the participant's status field
-- ARGV[2]  optional: the room's failure-record field (lua/lib/fate.lua), for shared fate. An open entry
--          ("1".."3") of a room whose first failure another participant raised, or that was cancelled,
--          reads "0" (kvstatus.rule.shared_status); nothing is written.
--
-- Returns {value_1, value_2, ...}: the stored string, or nil where there is no
-- entry. Validation happens in the client, which names the corrupted key.
-- Errors: "NOPERM <what>" when the ACL refuses HGET (HMGET with ARGV[2]) on the first key (see acl_refusal);
-- "KVSTATUS_CORRUPT <what>" when an open entry's room holds a failure record kvstatus does not write.

local SCRIPT = "get_many"

-- @include acl
-- @include stored
-- @include stored_text

-- Only to name a refused HGET: a read-only script cannot leave anything half-written.
local denied = #KEYS > 0 and acl_refusal(SCRIPT, ARGV[2] and "hmget" or "hget", KEYS[1])
if denied then
  return denied
end

local values, call, field, fate_field = {}, redis.call, ARGV[1], ARGV[2]
if not fate_field then
  for i = 1, #KEYS do
    values[i] = call("HGET", KEYS[i], field)
  end
  return values
end
for i = 1, #KEYS do
  local read = call("HMGET", KEYS[i], field, fate_field)
  local own, fate = read[1], read[2]
  if fate and (own == "1" or own == "2" or own == "3") then
    local stage, origin = stored_fate(fate)
    if not stage then
      return redis.error_reply("KVSTATUS_CORRUPT key " .. KEYS[i] .. " field " .. fate_field .. " holds "
        .. string.format("%q", string.sub(fate, 1, 40)) .. ", not a failure record")
    end
    if origin ~= field or stage == "cancelled" then
      own = "0"
    end
  end
  values[i] = own
end
return values
