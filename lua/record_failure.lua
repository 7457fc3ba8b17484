-- Record why a participant's entry failed; the first root cause wins.
-- A reason is only recorded while the participant has an entry, so a late
-- failure report for a cleared room cannot resurrect it.
--
-- KEYS[1]  room hash
-- ARGV[1]  the participant's status field
-- ARGV[2]  the participant's failure-reason field
-- ARGV[3]  the reason text: UTF-8, at most 2048 bytes (the Python API's bound, lua/lib/stored.lua)
-- ARGV[4]  TTL in milliseconds, a positive integer
-- ARGV[5]  optional, with ARGV[6]: the participant's incarnation field ("inc:<participant>")
-- ARGV[6]  the writer's incarnation epoch (lua/lease.lua): an entry stamped by a later incarnation
--          (lua/update.lua) is REFUSED_SUPERSEDED, nothing written
--
-- A reason recorded after the update to Failed that recorded the room's first failure
-- (lua/lib/fate.lua) without one fills in that record's reason too.
--
-- Returns an integer, kvstatus.model.ReasonOutcome (the constants below; they
-- continue kvstatus.model.Outcome, so a number means one thing in every script):
--   RECORDED         the reason was stored and the room's TTL refreshed (never shortened, see EXPIRE_FLAGS in lua/lib/time.lua)
--   KEPT_EARLIER     an earlier reason stays; nothing written
--   IGNORED_MISSING  the participant has no entry (or, for a writer with an epoch, only a previous
--                    incarnation's); nothing written
--   REFUSED_SUPERSEDED  (kvstatus.model.Outcome) a later incarnation of the participant wrote the entry;
--                    nothing written
-- Errors, raised before the first write:
--   "KVSTATUS_BADARG <what>"  malformed arguments
--   "NOPERM <what>"           the ACL refuses a command this script runs (see acl_refusal)

local IGNORED_MISSING, RECORDED, KEPT_EARLIER, REFUSED_SUPERSEDED = 5, 8, 9, 15
local SCRIPT = "record_failure"

-- @include acl
-- @include time
-- @include fate
-- @include stored
-- @include stored_text

local field, reason_field, reason, ttl, inc_field, epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]

if not positive_ms(ttl) then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if #KEYS ~= 1 or not reason or field == "" or reason_field == "" or #ARGV == 5 or #ARGV > 6 or inc_field == "" then
  return redis.error_reply("KVSTATUS_BADARG expected one key, status field, reason field and reason"
    .. " (and optionally an incarnation field and an epoch)")
end
if epoch and not stored_int(epoch) then
  return redis.error_reply("KVSTATUS_BADARG the incarnation epoch must be a positive integer of 1..15 digits")
end
if not stored_text(reason) then
  return redis.error_reply("KVSTATUS_BADARG the reason must be UTF-8 text of at most 2048 bytes (kvstatus cuts"
    .. " longer ones before sending)")
end

local denied = acl_refusal(SCRIPT, "hexists", KEYS[1]) or acl_refusal(SCRIPT, "hsetnx", KEYS[1])
  or acl_refusal(SCRIPT, "pexpire", KEYS[1])
if denied then
  return denied
end

if redis.call("HEXISTS", KEYS[1], field) == 0 then
  return IGNORED_MISSING
end
local stamp = epoch and stored_int(redis.call("HGET", KEYS[1], inc_field))  -- junk: no stamp (lua/update.lua)
if stamp and stamp > tonumber(epoch) then
  return REFUSED_SUPERSEDED
elseif stamp and stamp < tonumber(epoch) then
  return IGNORED_MISSING  -- a previous incarnation's entry: missing for this one (lua/update.lua)
end
if redis.call("HSETNX", KEYS[1], reason_field, reason) == 0 then
  return KEPT_EARLIER
end
-- best effort, like the record
local fate = not acl_refusal(SCRIPT, "hget", KEYS[1]) and not acl_refusal(SCRIPT, "hset", KEYS[1])
  and redis.call("HGET", KEYS[1], FATE_FIELD)
local stage, origin = string.match(fate or "", "^%d+:([%a-]+):([^:]*):$")  -- a record without a reason
if origin == field and stage ~= "cancelled" then
  redis.call("HSET", KEYS[1], FATE_FIELD, fate .. reason)
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
