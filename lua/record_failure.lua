-- Record why a participant's entry failed; the first root cause wins.
-- A reason is only recorded while the participant has an entry, so a late
-- failure report for a cleared room cannot resurrect it.
--
-- KEYS[1]  room hash
-- ARGV[1]  the participant's status field
-- ARGV[2]  the participant's failure-reason field
-- ARGV[3]  the reason text
-- ARGV[4]  TTL in milliseconds, a positive integer
--
-- Returns an integer, kvstatus.rule.ReasonOutcome (the constants below; they
-- continue kvstatus.rule.Outcome, so a number means one thing in every script):
--   RECORDED         the reason was stored and the room's TTL refreshed (never shortened, see EXPIRE_FLAGS)
--   KEPT_EARLIER     an earlier reason stays; nothing written
--   IGNORED_MISSING  the participant has no entry; nothing written
-- Errors, raised before the first write:
--   "KVSTATUS_BADARG <what>"  malformed arguments
--   "NOPERM <what>"           the ACL refuses a command this script runs (see acl_refusal)

local IGNORED_MISSING, RECORDED, KEPT_EARLIER = 5, 8, 9
local SCRIPT = "record_failure"

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

-- One TTL per room key, shared by its participants, and a write never shortens it: the key's TTL
-- becomes max(TTL left, ttl), a key without TTL counting as 0. Written the same in every kvstatus
-- script that sets a TTL. Redis >= 7 does it with PEXPIRE NX / GT, in one call when the first flag
-- fits: NX for a key this call probably created (no TTL yet), else GT; the other flag follows when
-- the first set nothing, and either order ends the same. GT alone would never give a TTL to a key
-- that has none: Redis counts that as infinite. Older servers (no REDIS_VERSION_NUM, no flags)
-- compare with PTTL first.
local EXPIRE_FLAGS = redis.REDIS_VERSION_NUM ~= nil

local field, reason_field, reason, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4]

if type(ttl) ~= "string" or not string.match(ttl, "^[1-9][0-9]*$") or #ttl > 15 then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if #KEYS ~= 1 or not reason or field == "" or reason_field == "" then
  return redis.error_reply("KVSTATUS_BADARG expected one key, status field, reason field and reason")
end

local denied = acl_refusal("hexists", KEYS[1]) or acl_refusal("hsetnx", KEYS[1]) or acl_refusal("pexpire", KEYS[1])
if denied then
  return denied
end

if redis.call("HEXISTS", KEYS[1], field) == 0 then
  return IGNORED_MISSING
end
if redis.call("HSETNX", KEYS[1], reason_field, reason) == 0 then
  return KEPT_EARLIER
end
-- The participant has an entry, so the key has a TTL already (GT first).
if EXPIRE_FLAGS then
  if redis.call("PEXPIRE", KEYS[1], ttl, "GT") == 0 then
    redis.call("PEXPIRE", KEYS[1], ttl, "NX")
  end
elseif redis.call("PTTL", KEYS[1]) < tonumber(ttl) then
  redis.call("PEXPIRE", KEYS[1], ttl)
end
return RECORDED
