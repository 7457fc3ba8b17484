#!lua flags=no-writes
-- Read one participant's status from each room hash in KEYS, in one command.
-- Read-only (the flag above), so Redis >= 7 may run it on a replica and during OOM.
--
-- KEYS[i]  room hash of the i-th room. Not checked to belong together (lua/lib/keys.lua), unlike the
--          keys of the other scripts of many keys: this one writes nothing, each key's answer is that key's own
--          HGET, which the ACL allows or not, and the check would add 15-30 % to its Redis time.
-- ARGV[1]  the participant's status field
--
-- Returns {value_1, value_2, ...}: the stored string, or nil where there is no
-- entry. Validation happens in the client, which names the corrupted key.
-- Errors: "NOPERM <what>" when the ACL refuses HGET on the first key (see acl_refusal).

local SCRIPT = "get_many"

-- @include acl

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
