-- Record why a participant's entry failed; the first root cause wins.
-- A reason is only recorded while the participant has an entry, so a late
-- failure report for a cleared room cannot resurrect it.
--
-- KEYS[1]  room hash
-- ARGV[1]  the participant's status field
-- ARGV[2]  the participant's failure-reason field
-- ARGV[3]  the reason text
-- ARGV[4]  TTL in milliseconds, a positive integer
--
-- Returns 1 RECORDED (TTL refreshed), 2 KEPT_EARLIER (an earlier reason
-- stays; nothing written), 0 IGNORED_MISSING (no entry; nothing written).
-- Errors: "KVSTATUS_BADARG <what>" for malformed arguments; "NOPERM <what>" when
-- the ACL would refuse HSETNX or PEXPIRE (checked before writing, on Redis >= 7).

local RECORDED, KEPT_EARLIER, IGNORED_MISSING = 1, 2, 0
local field, reason_field, reason, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if type(ttl) ~= "string" or not string.match(ttl, "^[1-9][0-9]*$") or #ttl > 15 then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if not reason or field == "" or reason_field == "" then
  return redis.error_reply("KVSTATUS_BADARG expected status field, reason field and reason")
end

if redis.acl_check_cmd then
  for _, command in ipairs({"hsetnx", "pexpire"}) do
    local args = command == "hsetnx" and {reason_field, reason} or {ttl}
    if not redis.acl_check_cmd(command, KEYS[1], unpack(args)) then
      return redis.error_reply("NOPERM this user has no permissions to run the '" .. command
        .. "' command on key " .. KEYS[1] .. " (checked by the kvstatus record_failure script before writing)")
    end
  end
end

if redis.call("HEXISTS", KEYS[1], field) == 0 then
  return IGNORED_MISSING
end
if redis.call("HSETNX", KEYS[1], reason_field, reason) == 0 then
  return KEPT_EARLIER
end
redis.call("PEXPIRE", KEYS[1], ttl)
return RECORDED
