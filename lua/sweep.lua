-- Fail a lost participant's non-terminal entries (kvstatus sweep, kvstatus/admin/sweep.py).
-- For each room hash in KEYS, atomically: an entry in Bootstrapping, WaitingForInput or
-- Transferring becomes Failed, exactly the update rule's FAILED row (so under `strict` a late write
-- of the lost participant cannot undo it), and the reason is recorded unless an earlier one is
-- kept; the room's first failure is recorded (stage lease-lost, or ARGV[4], lua/lib/fate.lua) unless
-- it has one. Also run by a store's peer watch (kvstatus/peerwatch.py) on the rooms it has open.
-- A swept entry's timeline (lua/lib/timeline.lua), if it has one, gets the Failed step in the same HSET
-- (a malformed one is left as it is). Success, Failed and missing entries are left alone. The room's TTL is not touched: the
-- sweeper does not extend a room's life, and HSET keeps the TTL the key already has.
--
-- KEYS[i]  room hash, all of one namespace (checked, see lua/lib/keys.lua)
-- ARGV[1]  the lost participant's status field
-- ARGV[2]  its failure-reason field
-- ARGV[3]  the reason, e.g. "participant decode-1 lost its lease"
-- ARGV[4]  optional: the stage of the room's first failure, "lease-lost" (default) or "superseded"
--          (the participant restarted under the same name: this entry was its previous incarnation's)
-- ARGV[5]  optional, with ARGV[6]: the participant's incarnation field ("inc:<participant>")
-- ARGV[6]  the fence: a positive integer epoch (lua/lease.lua). An entry stamped with this epoch or a later
--          one belongs to an incarnation that took the name over after the caller's read, and is left as it
--          is (UNCHANGED); unstamped entries, older stamps and stamps kvstatus does not write
--          (lua/lib/stored.lua) are swept.
--
-- Returns one integer per key, kvstatus.model.Outcome: FAILED (swept), REFUSED_TERMINAL (a Success of the swept
-- incarnation, left as it is: its part was done), UNCHANGED (Failed, fenced off, or a value kvstatus does not
-- write: left as it is), IGNORED_MISSING (no entry).
-- Errors, raised before the first write: "KVSTATUS_BADARG <what>" (malformed arguments, or keys that
-- do not belong together), "NOPERM <what>".

local FAILED, UNCHANGED, IGNORED_MISSING, REFUSED_TERMINAL = 3, 4, 5, 6
local SCRIPT = "sweep"

-- @include acl
-- @include keys
-- @include time
-- @include fate
-- @include stored
-- @include stored_text
-- @include timeline

local field, reason_field, reason, stage = ARGV[1], ARGV[2], ARGV[3], ARGV[4] or "lease-lost"
local inc_field, below = ARGV[5], ARGV[6]
if #KEYS == 0 or #ARGV < 3 or #ARGV > 6 or #ARGV == 5 or field == "" or reason_field == "" or inc_field == "" then
  return redis.error_reply("KVSTATUS_BADARG expected room keys, a status field, a reason field, a reason, a stage"
    .. " and optionally an incarnation field and a fence epoch")
end
if below then
  below = stored_int(below)
  if not below then
    return redis.error_reply("KVSTATUS_BADARG the fence epoch must be a positive integer of 1..15 digits")
  end
end
if stage ~= "lease-lost" and stage ~= "superseded" then
  return redis.error_reply("KVSTATUS_BADARG the stage must be lease-lost or superseded")
end
if not stored_text(reason) then
  return redis.error_reply("KVSTATUS_BADARG the reason must be UTF-8 text of at most 2048 bytes")
end
local refused = #KEYS > 1 and room_keys_refusal(KEYS, 1, #KEYS)
if refused then
  return refused
end

local result, timelines, now = {}, {}, nil
local tl_field = "t:" .. field
for i = 1, #KEYS do
  local stored, stamp, timeline
  if below then
    local all = redis.call("HMGET", KEYS[i], field, tl_field, inc_field)
    stored, timeline, stamp = all[1], all[2], stored_int(all[3])  -- junk: no stamp
  else
    local both = redis.call("HMGET", KEYS[i], field, tl_field)
    stored, timeline = both[1], both[2]
  end
  if not stored then
    result[i] = IGNORED_MISSING
  elseif (stored == "1" or stored == "2" or stored == "3") and not (stamp and stamp >= below) then
    local denied = acl_refusal(SCRIPT, "hset", KEYS[i]) or acl_refusal(SCRIPT, "hsetnx", KEYS[i])
    if timeline and not now and not denied then
      denied = acl_refusal(SCRIPT, "time", KEYS[i])
      now = not denied and now_ms()
    end
    if denied then
      return denied
    end
    result[i] = FAILED
    timelines[i] = timeline and timeline_after(timeline, 0, now)
  elseif stored == "4" and not (stamp and stamp >= below) then
    result[i] = REFUSED_TERMINAL
  else
    result[i] = UNCHANGED
  end
end
for i = 1, #KEYS do
  if result[i] == FAILED then
    if timelines[i] then
      redis.call("HSET", KEYS[i], field, "0", tl_field, timelines[i])
    else
      redis.call("HSET", KEYS[i], field, "0")
    end
    redis.call("HSETNX", KEYS[i], reason_field, reason)
    if not fate_refusal(SCRIPT, KEYS[i]) then  -- best effort, as in lua/update.lua
      record_fate(KEYS[i], stage, field, reason)
    end
  end
end
return result
