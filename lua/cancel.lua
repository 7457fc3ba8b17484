-- Cancel rooms for every participant (store.cancel, kvstatus cancel): a router or an operator that knows
-- only the room id fails it, with a reason, through the update rule.
-- For each room hash in KEYS, atomically:
--   * a room already fully served (it has entries, every one of them Success, and no first failure) is left
--     exactly as it is: nothing is failed, no first failure is recorded, its TTL is not touched (ALREADY_SERVED),
--     so health, the exporter's pair gauges and /ready still count it as succeeded. The rule's Python
--     reference is kvstatus.rule.cancel_outcome. Otherwise:
--   * every open entry (Bootstrapping, WaitingForInput, Transferring) becomes Failed, exactly the update
--     rule's FAILED row, with the reason "cancelled by <origin>: <reason>" unless an earlier one is kept;
--     Success and Failed entries are left alone, and so is a value kvstatus does not write. A failed entry's
--     timeline (lua/lib/timeline.lua), if it has one, gets the Failed step in the same HSET (a malformed one
--     is left as it is);
--   * the room's first failure is recorded (stage cancelled, lua/lib/fate.lua) unless it has one. A room
--     with no entry yet gets the record alone, with the TTL: a participant that writes later reads Failed
--     (shared fate), and its room never comes back to life while the record lives;
--   * the TTL becomes at least ARGV[1] (never shortened, see EXPIRE_FLAGS in lua/lib/time.lua).
--
-- KEYS[i]  room hash, all of one namespace (checked, see lua/lib/keys.lua)
-- ARGV[1]  TTL in milliseconds, a positive integer
-- ARGV[2]  origin: who cancels (a name: letters, digits, "_", ".", "-")
-- ARGV[3]  the reason text: UTF-8, at most 2048 bytes (the Python API's bound, lua/lib/stored.lua)
--
-- Returns {outcome_1, failed_1, outcome_2, failed_2, ...}, integers: outcome kvstatus.model.CancelOutcome,
-- CANCELLED (this cancel is the room's first failure), ALREADY_FAILED (the room had failed before: its
-- first failure stays) or ALREADY_SERVED (every entry is Success: nothing written); failed, the number of
-- entries this cancel turned Failed (0 for ALREADY_SERVED).
-- Errors, raised before the first write: "KVSTATUS_BADARG <what>" (malformed arguments, keys that do not
-- belong together), "NOPERM <what>".

local CANCELLED, ALREADY_FAILED, ALREADY_SERVED = 13, 14, 16
local SCRIPT = "cancel"

-- @include acl
-- @include time
-- @include keys
-- @include fate
-- @include stored
-- @include stored_text
-- @include timeline

local ttl, origin, reason = ARGV[1], ARGV[2], ARGV[3]
if #KEYS == 0 or #ARGV ~= 3 then
  return redis.error_reply("KVSTATUS_BADARG expected room keys, a TTL, an origin and a reason")
end
if not positive_ms(ttl) then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if not stored_name(origin) then
  return redis.error_reply("KVSTATUS_BADARG origin must be a name of 1..128 letters, digits, _ . -")
end
if not stored_text(reason) then
  return redis.error_reply("KVSTATUS_BADARG the reason must be UTF-8 text of at most 2048 bytes (kvstatus cuts"
    .. " longer ones before sending)")
end
local refused = room_keys_refusal(KEYS, 1, #KEYS)
if refused then
  return refused
end

-- First pass: read and ask the ACL; nothing is written yet. The key patterns are the same for every
-- command here (lua/update.lua explains why one check per command is enough), PEXPIRE per key.
local first = KEYS[1]
local denied = acl_refusal(SCRIPT, "hgetall", first) or acl_refusal(SCRIPT, "hset", first)
  or fate_refusal(SCRIPT, first)
for i = 1, #KEYS do
  denied = denied or acl_refusal(SCRIPT, "pexpire", KEYS[i])
end
if denied then
  return denied
end
local open, timelines, served = {}, {}, {}
for i = 1, #KEYS do
  local fields, names, steps = redis.call("HGETALL", KEYS[i]), {}, {}
  local entries, successes, failed_before = 0, 0, false
  for j = 1, #fields, 2 do
    local name, value = fields[j], fields[j + 1]
    if not string.find(name, ":", 1, true) then
      entries = entries + 1
      if value == "4" then
        successes = successes + 1
      elseif value == "1" or value == "2" or value == "3" then
        names[#names + 1] = name
      end
    elseif name == FATE_FIELD then
      failed_before = true
    elseif string.sub(name, 1, 2) == "t:" then
      steps[string.sub(name, 3)] = value
    end
  end
  open[i], timelines[i] = names, steps
  served[i] = entries > 0 and successes == entries and not failed_before
end

-- Second pass: write.
local text = "cancelled by " .. origin .. ": " .. reason
local now = nil

-- Fail the open entries `names` of room `key` (their timelines in `steps`), record its first failure unless it
-- has one, raise its TTL; returns the outcome and how many entries it failed.
local function cancel_room(key, names, steps)
  for _, name in ipairs(names) do
    local timeline = steps[name]
    if timeline then
      now = now or now_ms()  -- TIME: asked of the ACL by fate_refusal above
      timeline = timeline_after(timeline, 0, now)
    end
    if timeline then
      redis.call("HSET", key, name, "0", "t:" .. name, timeline)
    else
      redis.call("HSET", key, name, "0")
    end
    redis.call("HSETNX", key, "reason:" .. name, text)
  end
  local outcome = record_fate(key, "cancelled", origin, reason) == 1 and CANCELLED or ALREADY_FAILED
  if EXPIRE_FLAGS then
    if redis.call("PEXPIRE", key, ttl, "GT") == 0 then
      redis.call("PEXPIRE", key, ttl, "NX")
    end
  elseif redis.call("PTTL", key) < tonumber(ttl) then
    redis.call("PEXPIRE", key, ttl)
  end
  return outcome, #names
end

local result = {}
for i = 1, #KEYS do
  if served[i] then
    result[2 * i - 1], result[2 * i] = ALREADY_SERVED, 0
  else
    result[2 * i - 1], result[2 * i] = cancel_room(KEYS[i], open[i], timelines[i])
  end
end
return result
