-- kvstatus update rule, applied atomically to one participant's entry in each
-- room hash named in KEYS. kvstatus/rule.py:apply_rule is the same table in
-- Python; the tests hold the two together.
--
-- KEYS[i]    room hash of the i-th room
-- ARGV[1]    policy: "seed" or "strict"
-- ARGV[2]    TTL in milliseconds, a positive integer
-- ARGV[3]    the participant's status field
-- ARGV[4]    the participant's failure-reason field
-- ARGV[4+i]  new status for KEYS[i], "0".."4"
--
-- Returns {outcome_1, status_1, outcome_2, status_2, ...}, integers only:
--   outcome  kvstatus.rule.Outcome (the constants below)
--   status   the entry's status afterwards, 0..4, or -1 when there is no entry
-- Errors, raised before the first write, so nothing is half-written:
--   "KVSTATUS_BADARG <what>"   malformed arguments
--   "KVSTATUS_CORRUPT <what>"  a stored status is not "0".."4"; it is left as it is
--   "NOPERM <what>"            the ACL refuses a command this script runs (see acl_refusal)
-- CREATED, ADVANCED, FAILED and UNCHANGED refresh the room's TTL; the others write nothing.

local CREATED, ADVANCED, FAILED, UNCHANGED = 1, 2, 3, 4
local IGNORED_MISSING, REFUSED_TERMINAL, REFUSED_CREATE = 5, 6, 7
local STATUS_FAILED, STATUS_WAITING_FOR_INPUT = 0, 2
local STATUS = {["0"] = 0, ["1"] = 1, ["2"] = 2, ["3"] = 3, ["4"] = 4}
local SCRIPT = "update"

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

local policy, ttl, field, reason_field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if policy ~= "seed" and policy ~= "strict" then
  return redis.error_reply("KVSTATUS_BADARG policy must be seed or strict")
end
if type(ttl) ~= "string" or not string.match(ttl, "^[1-9][0-9]*$") or #ttl > 15 then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if not field or field == "" or not reason_field or reason_field == "" then
  return redis.error_reply("KVSTATUS_BADARG participant fields must be non-empty")
end
if #KEYS == 0 or #ARGV ~= 4 + #KEYS then
  return redis.error_reply("KVSTATUS_BADARG expected one status per key, and at least one key")
end

-- Every command on the first key, PEXPIRE on each further one. A user's own ACL
-- rules allow a command on a key when the command is allowed (the same for every
-- key) and the key matches its patterns (the same for HSET, HDEL and PEXPIRE:
-- each needs read-write access). So once the first key passes, PEXPIRE passing
-- on a key means every write on it will pass: nothing is half-written. Under ACL
-- selectors, which can grant HSET and PEXPIRE on different keys, a batch could
-- stop half way, but never before the TTL of a key it wrote: PEXPIRE is checked
-- on every key. One check per further key instead of three costs ~0.3 µs less per key.
local denied = acl_refusal({"hget", "hset", "hdel", "pexpire"}, 1, 1) or acl_refusal({"pexpire"}, 2, #KEYS)
if denied then
  return redis.error_reply(denied)
end

-- First pass: validate every argument and read every entry; no writes yet.
local current, new = {}, {}
for i = 1, #KEYS do
  local s = STATUS[ARGV[4 + i]]
  if not s then
    return redis.error_reply("KVSTATUS_BADARG status for key " .. KEYS[i] .. " must be 0..4")
  end
  new[i] = s
  local stored = redis.call("HGET", KEYS[i], field)
  if stored then
    local cur = STATUS[stored]
    if not cur then
      return redis.error_reply("KVSTATUS_CORRUPT key " .. KEYS[i] .. " field " .. field
        .. " holds " .. string.format("%q", string.sub(stored, 1, 40)) .. ", not a status 0..4")
    end
    current[i] = cur
  else
    current[i] = false
  end
end

-- Second pass: apply the rule and write.
local result = {}
for i = 1, #KEYS do
  local key, cur, s = KEYS[i], current[i], new[i]
  local outcome, after
  if not cur then
    if s == STATUS_FAILED then
      outcome, after = IGNORED_MISSING, -1
    elseif policy == "strict" and s > STATUS_WAITING_FOR_INPUT then
      outcome, after = REFUSED_CREATE, -1
    else
      outcome, after = CREATED, s
    end
  elseif s == STATUS_FAILED then
    if cur == STATUS_FAILED then
      outcome, after = UNCHANGED, cur
    else
      outcome, after = FAILED, s
    end
  elseif cur == STATUS_FAILED and policy == "strict" then
    outcome, after = REFUSED_TERMINAL, cur
  elseif s > cur then
    outcome, after = ADVANCED, s
  else
    outcome, after = UNCHANGED, cur
  end

  if outcome == CREATED or outcome == ADVANCED or outcome == FAILED then
    redis.call("HSET", key, field, s)
    if cur == STATUS_FAILED then
      -- A seed-policy entry leaving Failed drops the reason of the failure it left.
      redis.call("HDEL", key, reason_field)
    end
  end
  if outcome <= UNCHANGED then
    redis.call("PEXPIRE", key, ttl)
  end
  result[2 * i - 1] = outcome
  result[2 * i] = after
end
return result
