-- For the benchmarks only: the checks DESIGN requires of every update script, run ahead of
-- minimal_rule.lua (benchmarks/cases.py splices the two): the arguments are validated before the
-- first write (§3), and the ACL is asked about every write in advance, so that a refused command
-- cannot leave a key half-written or without its TTL (§6). The two together are the floor of an
-- update script that keeps those promises; lua/update.lua adds fencing, the fate and timelines.
--
-- Same KEYS and ARGV as minimal_rule.lua. Errors: "KVSTATUS_BADARG <what>", "NOPERM <what>".

local SCRIPT = "required checks"

-- @include acl
-- @include time

local ttl, field = ARGV[1], ARGV[2]
if not positive_ms(ttl) then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if not field or field == "" then
  return redis.error_reply("KVSTATUS_BADARG the participant's field must be non-empty")
end
if #KEYS < 1 or #ARGV - 2 ~= #KEYS then
  return redis.error_reply("KVSTATUS_BADARG expected one status per key, and at least one key")
end
for i = 1, #KEYS do
  local arg = ARGV[2 + i]
  local s = #arg == 1 and string.byte(arg) - 48
  if not s or s < 0 or s > 4 then
    return redis.error_reply("KVSTATUS_BADARG status for key " .. KEYS[i] .. " must be 0..4")
  end
  local denied = (i == 1 and acl_refusal(SCRIPT, "hset", KEYS[i])) or acl_refusal(SCRIPT, "pexpire", KEYS[i])
  if denied then
    return denied
  end
end

