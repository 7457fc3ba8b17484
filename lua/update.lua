-- kvstatus update rule (DESIGN §2), applied atomically to one participant's
-- entry in each room hash named in KEYS. kvstatus/status.py:apply_rule is the
-- same table in Python; the tests hold the two together.
--
-- KEYS[i]    room hash of the i-th room
-- ARGV[1]    policy: "seed" or "strict"
-- ARGV[2]    TTL in milliseconds, a positive integer
-- ARGV[3]    the participant's status field
-- ARGV[4]    the participant's failure-reason field
-- ARGV[4+i]  new status for KEYS[i], "0".."4"
--
-- Returns {outcome_1, status_1, outcome_2, status_2, ...}, integers only:
--   outcome  1 CREATED  2 ADVANCED  3 FAILED  4 UNCHANGED
--            5 IGNORED_MISSING  6 REFUSED_TERMINAL  7 REFUSED_CREATE
--   status   the entry's status afterwards, 0..4, or -1 when there is no entry
-- Errors, raised before the first write, so nothing is half-written:
--   "KVSTATUS_BADARG <what>"   malformed arguments
--   "KVSTATUS_CORRUPT <what>"  a stored status is not "0".."4"; it is left as it is
--   "NOPERM <what>"            the ACL would refuse one of the writes (Redis >= 7 can tell
--                              in advance; a refusal half way would leave a key without TTL)
-- Outcomes 1-4 refresh the room's TTL; 5-7 write nothing.
-- Outcomes 1-3 publish "<status>:<participant>" on the room's channel, named like its key, for
-- wait_for: SPUBLISH (a shard channel: it stays on the key's node) where the server has it (Redis >= 7),
-- else PUBLISH. Only where the ACL allows it, asked before publishing: a user without the channel
-- still updates (its waiters fall back to re-reading), and a refused publish never fails an update.

local CREATED, ADVANCED, FAILED, UNCHANGED = 1, 2, 3, 4
local IGNORED_MISSING, REFUSED_TERMINAL, REFUSED_CREATE = 5, 6, 7
local STATUS_FAILED, STATUS_WAITING = 0, 2

local policy, ttl, field, reason_field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local PUBLISH = redis.REDIS_VERSION_NUM and "spublish" or "publish"

if policy ~= "seed" and policy ~= "strict" then
  return redis.error_reply("KVSTATUS_BADARG policy must be seed or strict")
end
if type(ttl) ~= "string" or not string.match(ttl, "^[1-9][0-9]*$") or #ttl > 15 then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if not field or field == "" or not reason_field or reason_field == "" then
  return redis.error_reply("KVSTATUS_BADARG participant fields must be non-empty")
end
if #ARGV ~= 4 + #KEYS then
  return redis.error_reply("KVSTATUS_BADARG expected one status per key")
end

-- The first of HSET, HDEL, PEXPIRE the ACL refuses on key, or nil.
local function refused_write(key)
  if not redis.acl_check_cmd then
    return nil  -- Redis < 7 cannot be asked in advance
  end
  if not redis.acl_check_cmd("hset", key, field, "0") then return "hset" end
  if not redis.acl_check_cmd("hdel", key, reason_field) then return "hdel" end
  if not redis.acl_check_cmd("pexpire", key, ttl) then return "pexpire" end
  return nil
end

-- First pass: validate every argument and read every entry; no writes yet.
local current, new = {}, {}
for i = 1, #KEYS do
  local denied = refused_write(KEYS[i])
  if denied then
    return redis.error_reply("NOPERM this user has no permissions to run the '" .. denied
      .. "' command on key " .. KEYS[i] .. " (checked by the kvstatus update script before writing)")
  end
  local s = ARGV[4 + i]
  if not string.match(s, "^[0-4]$") then
    return redis.error_reply("KVSTATUS_BADARG status for key " .. KEYS[i] .. " must be 0..4")
  end
  new[i] = tonumber(s)
  local stored = redis.call("HGET", KEYS[i], field)
  if stored then
    if not string.match(stored, "^[0-4]$") then
      return redis.error_reply("KVSTATUS_CORRUPT key " .. KEYS[i] .. " field " .. field
        .. " holds " .. string.format("%q", string.sub(stored, 1, 40)) .. ", not a status 0..4")
    end
    current[i] = tonumber(stored)
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
    elseif policy == "strict" and s > STATUS_WAITING then
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
    local message = s .. ":" .. field
    if not redis.acl_check_cmd or redis.acl_check_cmd(PUBLISH, key, message) then
      redis.call(PUBLISH, key, message)
    end
  end
  if outcome == ADVANCED and cur == STATUS_FAILED then
    -- A seed-policy entry leaving Failed drops the reason of the failure it left.
    redis.call("HDEL", key, reason_field)
  end
  if outcome <= UNCHANGED then
    redis.call("PEXPIRE", key, ttl)
  end
  result[2 * i - 1] = outcome
  result[2 * i] = after
end
return result
