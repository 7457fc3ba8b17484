-- The ACL pre-check of every kvstatus script ("-- @include acl").
-- Lua does not roll back, so a command the ACL refused half way would leave the writes before
-- it done, a created key without its TTL among them. Redis >= 7 can be asked in advance; older
-- servers cannot, and there the ACL must grant every command.
-- Returns the error naming `command` if the ACL refuses it on `key`, else nil; `script` (each script's own
-- SCRIPT local) is the kvstatus script named in the error.
local function acl_refusal(script, command, key)
  if redis.acl_check_cmd and not redis.acl_check_cmd(command, key) then
    return redis.error_reply("NOPERM this user has no permissions to run the '" .. command .. "' command on key "
      .. key .. " (checked in advance by the kvstatus " .. script .. " script)")
  end
  return nil
end
