-- Read one participant's status from each room hash in KEYS, in one command.
--
-- KEYS[i]  room hash of the i-th room
-- ARGV[1]  the participant's status field
--
-- Returns {value_1, value_2, ...}: the stored string, or nil where there is no
-- entry. Validation happens in the client, which names the corrupted key.

local values = {}
for i = 1, #KEYS do
  values[i] = redis.call("HGET", KEYS[i], ARGV[1])
end
return values
