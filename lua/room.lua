#!lua flags=no-writes
-- Everything stored for one room, and its tombstone, in one command (store.room()).
--
-- KEYS[1]  room hash
-- KEYS[2]  the room's tombstone hash (lua/clear.lua): KEYS[1]..":t" (checked, see lua/lib/keys.lua)
--
-- Returns {room_fields, room_pttl, tombstone_fields, tombstone_pttl}: the fields as flat
-- {name, value, ...} lists (HGETALL), the PTTLs as PTTL answers them (-2 no key, -1 no TTL); -3 and no
-- fields when the tombstone's name holds a key that is not a hash.
-- Errors: "NOPERM <what>" when the ACL refuses HGETALL on the room key (see acl_refusal);
-- "KVSTATUS_BADARG <what>" for keys that are not a room key and its tombstone.

local SCRIPT = "room"

-- @include acl
-- @include keys

if #KEYS ~= 2 then
  return redis.error_reply("KVSTATUS_BADARG expected a room key and its tombstone key")
end
local denied = room_keys_refusal(KEYS, 1, 1) or tombstone_refusal(KEYS[1], KEYS[2])
  or acl_refusal(SCRIPT, "hgetall", KEYS[1])
if denied then
  return denied
end
local fields, pttl = redis.call("HGETALL", KEYS[1]), redis.call("PTTL", KEYS[1])
-- A key at the tombstone's name that is not a hash (a tenant's SET) does not hide the room: its PTTL is
-- answered as -3 (kvstatus.replies.NOT_A_TOMBSTONE) and the reader names it in RoomView.ignored.
local tomb = redis.pcall("HGETALL", KEYS[2])
if tomb.err then
  return {fields, pttl, {}, -3}
end
return {fields, pttl, tomb, redis.call("PTTL", KEYS[2])}
