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
-- Returns the error naming `command` if the ACL refuses it on `key`, else nil.
local function acl_refusal(command, key)
  if redis.acl_check_cmd and not redis.acl_check_cmd(command, key) then
    return redis.error_reply("NOPERM this user has no permissions to run the '" .. command .. "' command on key "
      .. key .. " (checked in advance by the kvstatus " .. SCRIPT .. " script)")
  end
  return nil
end

-- Only to name a refused HGET: a read-only script cannot leave anything half-written.
local denied = #KEYS > 0 and acl_refusal("hget", KEYS[1])
if denied then
  return denied
end

local values = {}
for i = 1, #KEYS do
  values[i] = redis.call("HGET", KEYS[i], ARGV[1])
end
return values
