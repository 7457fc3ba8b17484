-- Clear one participant's entry and leave a tombstone, atomically.
-- The tombstone says who cleared the room, when (server clock) and at which status, so that
-- `kvstatus get` and room() can tell "cleared" from "expired or never existed". It has its own
-- short TTL and is never read by the update rule, so it cannot resurrect the room. A later
-- clear by the same participant replaces its note (and drops its late-abort note).
--
-- KEYS[1]  room hash
-- KEYS[2]  the room's tombstone hash (<room key>:t, same slot)
-- ARGV[1]  the participant's status field
-- ARGV[2]  the participant's failure-reason field
-- ARGV[3]  the participant's late-abort field in the tombstone ("late:<participant>")
-- ARGV[4]  tombstone TTL in milliseconds, a positive integer
--
-- Tombstone fields: <participant> = "<unix ms> <status 0..4>"; late:<participant> = "<unix ms>"
-- of the first Failed that arrived after the clear (written by lua/update.lua).
-- Returns the number of fields removed from the room (0: nothing to clear, no tombstone written).
-- Errors, raised before the first write: "KVSTATUS_BADARG <what>", "NOPERM <what>".

local SCRIPT = "clear"

-- The ACL pre-check, written the same in every kvstatus script. Lua does not
-- roll back, so a command the ACL refused half way would leave the writes before
-- it done, a created key without its TTL among them. Redis >= 7 can be asked in
-- advance; older servers cannot, and there the ACL must grant every command.
-- Returns the error naming `command` if the ACL refuses it on `key`, else nil.
local function acl_refusal(command, key)
  if redis.acl_check_cmd and not redis.acl_check_cmd(command, key) then
    return redis.error_reply("NOPERM this user has no permissions to run the '" .. command .. "' command on key "
      .. key .. " (checked in advance by the kvstatus " .. SCRIPT .. " script)")
  end
  return nil
end

local room, tomb = KEYS[1], KEYS[2]
local field, reason_field, late_field, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if #KEYS ~= 2 or #ARGV ~= 4 or field == "" or reason_field == "" or late_field == "" then
  return redis.error_reply("KVSTATUS_BADARG expected a room key, a tombstone key and three fields")
end
if type(ttl) ~= "string" or not string.match(ttl, "^[1-9][0-9]*$") or #ttl > 15 then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end

local stored = redis.call("HGET", room, field)
local denied = acl_refusal("hdel", room)
  or (stored and (acl_refusal("hset", tomb) or acl_refusal("pexpire", tomb) or acl_refusal("time", tomb)))
if denied then
  return denied
end

local removed = redis.call("HDEL", room, field, reason_field)
if stored then
  local time = redis.call("TIME")
  local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  redis.call("HSET", tomb, field, now .. " " .. stored)
  redis.call("HDEL", tomb, late_field)
  redis.call("PEXPIRE", tomb, ttl)
end
return removed
