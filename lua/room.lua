#!lua flags=no-writes
-- Everything stored for one room, and its tombstone, in one command (store.room()).
--
-- KEYS[1]  room hash
-- KEYS[2]  the room's tombstone hash (lua/clear.lua): KEYS[1]..":t" (checked, see lua/lib/keys.lua)
--
-- Returns {room_fields, room_pttl, tombstone_fields, tombstone_pttl}: the fields as flat
-- {name, value, ...} lists (HGETALL), the PTTLs as PTTL answers them (-2 no key, -1 no TTL).
-- Errors: "NOPERM <what>" when the ACL refuses HGETALL on the room key (see acl_refusal);
-- "KVSTATUS_BADARG <what>" for keys that are not a room key and its tombstone.

local SCRIPT = "room"

-- @include acl
-- @include keys

if #KEYS ~= 2 then
  return redis.error_reply("KVSTATUS_BADARG expected a room key and its tombstone key")
end
local denied = room_keys_refusal(1, 1) or tombstone_refusal(KEYS[1], KEYS[2]) or acl_refusal("hgetall", KEYS[1])
if denied then
  return denied
end
return {redis.call("HGETALL", KEYS[1]), redis.call("PTTL", KEYS[1]),
        redis.call("HGETALL", KEYS[2]), redis.call("PTTL", KEYS[2])}
