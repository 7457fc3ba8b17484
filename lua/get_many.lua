#!lua flags=no-writes
-- Read one participant's status from each room hash in KEYS, in one command.
-- Read-only (the flag above), so Redis >= 7 may run it on a replica and during OOM.
--
-- KEYS[i]  room hash of the i-th room
-- ARGV[1]  the participant's status field
--
-- Returns {value_1, value_2, ...}: the stored string, or nil where there is no
-- entry. Validation happens in the client, which names the corrupted key.
-- Errors: "NOPERM <what>" when the ACL refuses HGET on the first key (see acl_refusal).

local SCRIPT = "get_many"

-- The ACL pre-check, written the same in every kvstatus script. Lua does not
-- roll back, so a command the ACL refused half way would leave the writes before
-- it done, a created key without its TTL among them. Redis >= 7 can be asked in
-- advance; older servers cannot, and there the ACL must grant every command.
-- Returns the error naming the first of `commands` refused on KEYS[first..last], or nil.
local function acl_refusal(commands, first, last)
  if not redis.acl_check_cmd then
    return nil
  end
  for i = first, last do
    for _, command in ipairs(commands) do
      if not redis.acl_check_cmd(command, KEYS[i]) then
        return "NOPERM this user has no permissions to run the '" .. command .. "' command on key "
          .. KEYS[i] .. " (checked in advance by the kvstatus " .. SCRIPT .. " script)"
      end
    end
  end
  return nil
end


local denied = acl_refusal({"hget"}, 1, math.min(1, #KEYS))
if denied then
  return redis.error_reply(denied)
end

local values = {}
for i = 1, #KEYS do
  values[i] = redis.call("HGET", KEYS[i], ARGV[1])
end
return values
