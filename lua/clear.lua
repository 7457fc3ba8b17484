-- Clear one participant's entry and leave a tombstone, atomically.
-- The tombstone says who cleared the room, when (server clock) and at which status, so that
-- `kvstatus get` and room() can tell "cleared" from "expired or never existed". It has its own
-- short TTL and is never read by the update rule, so it cannot resurrect the room. A later
-- clear by the same participant replaces its note (and drops its late-abort note).
--
-- KEYS[1]  room hash
-- KEYS[2]  the room's tombstone hash (<room key>:t, same slot; checked, see lua/lib/keys.lua)
-- ARGV[1]  the participant's status field
-- ARGV[2]  the participant's failure-reason field
-- ARGV[3]  the participant's late-abort field in the tombstone ("late:<participant>")
-- ARGV[4]  tombstone TTL in milliseconds, a positive integer; "0": remove the entry, write no tombstone
-- ARGV[5]  the participant's incarnation field ("inc:<participant>"): removed with the entry, but for a clear
--          with an epoch and a tombstone, which leaves the stamp behind as a fence (below)
-- ARGV[6]  the clearing incarnation's epoch (lua/lease.lua), or "" for a store without a lease: an entry
--          stamped by a newer incarnation of the participant (lua/update.lua) is not cleared (refused), and
--          one stamped by an older one is missing for this incarnation (nothing cleared, as for no entry)
-- ARGV[7]  the participant's timeline field ("t:<participant>", lua/lib/timeline.lua), removed with the entry
--
-- The fence outlives the entry: a clear with an epoch (ARGV[6]) and a tombstone leaves "inc:<participant>" =
-- the epoch in the room, so a late write of an older incarnation of the participant is still refused
-- (REFUSED_SUPERSEDED, lua/update.lua) instead of creating the entry again (issue 36, Medium 7). A room left
-- with nothing but stamps keeps them no longer than the tombstone (its TTL only shortened, PEXPIRE LT); the
-- views do not count such a room (kvstatus.model.RoomView.exists).
--
-- Tombstone fields: <participant> = "<unix ms> <status 0..4>"; late:<participant> = "<unix ms>"
-- of the first Failed that arrived after the clear (written by lua/update.lua).
-- Returns {removed, status, timeline}: the number of fields removed from the room (0: nothing to clear,
-- no tombstone written; -1: refused, the entry belongs to a newer incarnation, nothing written), the
-- entry's status before the clear, 0..4, -1 when there was no entry, or -2 when it held something that is
-- not a status (removed all the same), and the timeline the clear removed ("" when none; as stored, so
-- the caller can observe the entry's stage durations).
-- Errors, raised before the first write: "KVSTATUS_BADARG <what>" (malformed arguments, or keys that
-- do not belong together), "NOPERM <what>".

local SCRIPT = "clear"

-- @include acl
-- @include time
-- @include keys
-- @include fate
-- @include stored

local room, tomb = KEYS[1], KEYS[2]
local field, reason_field, late_field, ttl, inc_field, epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local tl_field = ARGV[7]
if #KEYS ~= 2 or #ARGV ~= 7 or field == "" or reason_field == "" or late_field == "" or inc_field == ""
    or tl_field == "" then
  return redis.error_reply("KVSTATUS_BADARG expected a room key, a tombstone key, four fields, a TTL, an epoch"
    .. " and a timeline field")
end
if ttl ~= "0" and not positive_ms(ttl) then
  return redis.error_reply("KVSTATUS_BADARG TTL must be 0 or a positive integer of milliseconds")
end
if epoch ~= "" and not stored_int(epoch) then
  return redis.error_reply("KVSTATUS_BADARG the incarnation epoch must be empty or a positive integer")
end
local tombstone = ttl ~= "0"
local refused = room_keys_refusal(KEYS, 1, 1) or tombstone_refusal(room, tomb)
if refused then
  return refused
end

local both = redis.call("HMGET", room, field, inc_field, tl_field)
local stored = both[1]
local status = -1
if stored then
  local code = #stored == 1 and string.byte(stored) - string.byte("0")
  status = (code and code >= 0 and code <= 4) and code or -2
end
local stamp = epoch ~= "" and both[2] ~= epoch and stored_int(both[2])  -- junk: no stamp (lua/update.lua)
if stamp then
  local mine = tonumber(epoch)
  if stamp > mine then
    return {-1, status, ""}
  elseif stamp < mine then
    return {0, -1, ""}  -- a previous incarnation's entry: missing for this one (lua/update.lua), nothing to clear
  end
end
local fence = stored and tombstone and epoch ~= ""
local denied = acl_refusal(SCRIPT, "hdel", room)
  or (fence and (acl_refusal(SCRIPT, "hset", room) or acl_refusal(SCRIPT, "pexpire", room)))
  or (stored and tombstone and (acl_refusal(SCRIPT, "hset", tomb) or acl_refusal(SCRIPT, "pexpire", tomb)
    or acl_refusal(SCRIPT, "time", tomb)))
if denied then
  return denied
end

local removed
if fence then
  removed = redis.call("HDEL", room, field, reason_field, tl_field)
  redis.call("HSET", room, inc_field, epoch)
else
  removed = redis.call("HDEL", room, field, reason_field, inc_field, tl_field)
end
-- A room whose last entry this clear removed keeps its stamps as fences and, unless cancelled, nothing else:
-- a failed room's first failure goes (the room is gone for every view), and the stamps last no longer than
-- the tombstone. A cancel's record stays until the room's TTL, so that a late write finds the room cancelled.
-- (Best effort: a user without HGETALL leaves it to the TTL.)
if removed > 0 and not acl_refusal(SCRIPT, "hgetall", room) then
  local fields, fate, left = redis.call("HGETALL", room), nil, false
  for i = 1, #fields, 2 do
    local name = fields[i]
    if name == FATE_FIELD then
      fate = fields[i + 1]
    elseif string.sub(name, 1, 4) ~= "inc:" and string.sub(name, 1, 2) ~= "t:" then
      left = true  -- a participant's entry or failure reason
    end
  end
  local cancelled = fate and string.find(fate, "^%d+:cancelled:")
  if not left and not cancelled then
    if fate then
      redis.call("HDEL", room, FATE_FIELD)
    end
    if fence then
      if EXPIRE_FLAGS then
        redis.call("PEXPIRE", room, ttl, "LT")
      else  -- what LT does, on a server without expire flags: no TTL counts as infinite
        local left_ms = redis.call("PTTL", room)
        if left_ms == -1 or left_ms > tonumber(ttl) then
          redis.call("PEXPIRE", room, ttl)
        end
      end
    end
  end
end
if stored and tombstone then
  redis.call("HSET", tomb, field, now_ms() .. " " .. stored)
  redis.call("HDEL", tomb, late_field)
  redis.call("PEXPIRE", tomb, ttl)
end
return {removed, status, both[3] or ""}
