#!lua flags=no-writes
-- Everything stored for one room, and its tombstone, in one command (store.room()).
--
-- KEYS[1]  room hash
-- KEYS[2]  the room's tombstone hash (lua/clear.lua)
--
-- Returns {room_fields, room_pttl, tombstone_fields, tombstone_pttl}: the fields as flat
-- {name, value, ...} lists (HGETALL), the PTTLs as PTTL answers them (-2 no key, -1 no TTL).
-- Errors: "NOPERM <what>" when the ACL refuses HGETALL on the room key (see acl_refusal).

local SCRIPT = "room"

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

if #KEYS ~= 2 then
  return redis.error_reply("KVSTATUS_BADARG expected a room key and its tombstone key")
end
local denied = acl_refusal("hgetall", KEYS[1])
if denied then
  return denied
end
return {redis.call("HGETALL", KEYS[1]), redis.call("PTTL", KEYS[1]),
        redis.call("HGETALL", KEYS[2]), redis.call("PTTL", KEYS[2])}
