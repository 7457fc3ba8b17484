#!lua flags=no-writes
-- The consensus read of many rooms over expected participants, in one command (single Redis).
-- kvstatus/rule.py turns the reply into each room's RoomConsensus; on a cluster it reads the
-- same data with one HMGET per room and this script once per lease key (ARGV[1] = "0", ARGV[2] = "").
--
-- KEYS[1..n]      room hashes
-- KEYS[n+1..n+p]  lease records of the p participants, in ARGV order (lua/lease.lua), of the rooms'
--                 namespace (checked with the room keys, see lua/lib/keys.lua)
-- ARGV[1]         n, the number of rooms
-- ARGV[2]         the room's failure-record field (lua/lib/fate.lua, kvstatus.keys.FATE_FIELD) for shared fate,
--                 or "": none is read
-- ARGV[3..p+2]    participant names (status fields)
--
-- Returns {leases, codes, reasons, epochs, fates}:
--   leases    p integers: 0 the participant never held a lease (no record), 1 alive, 2 lost
--             (released, or the deadline passed by the server's clock)
--   epochs    p integers: the epoch of the incarnation the lease record names (0: none), the fence a
--             sweep of a lost participant's entries passes to lua/sweep.lua
--   codes     n strings of p characters, one per room: character j is participant j's status
--             "0".."4", or "-" where it has no entry (compact: the client decodes a room at once)
--   reasons   {k, reason, ...}: for each Failed entry, k = (i - 1) * p + j (0-based room-major
--             index of room i, participant j) and its recorded failure reason, when there is one
--   fates     {i, record, ...}: with ARGV[2], for each room (0-based i) with an entry not at Success or a
--             participant missing, its first failure, when it has one: the read may answer Failed then
-- Errors: "KVSTATUS_BADARG <what>" (malformed arguments, keys that do not belong together);
-- "KVSTATUS_CORRUPT <what>" when a stored status is not "0".."4" (it is left as it is); "NOPERM <what>"
-- when the ACL refuses HMGET on the first key.

local SCRIPT = "room_statuses"

-- @include acl
-- @include time
-- @include keys
-- @include stored

local n = tonumber(ARGV[1])
local fate_field = ARGV[2] ~= "" and ARGV[2] or nil
local p = #ARGV - 2
if not n or n < 0 or n % 1 ~= 0 or p < 1 or #KEYS ~= n + p then
  return redis.error_reply("KVSTATUS_BADARG expected n room keys then one lease key per participant")
end
local denied, base = nil, nil
if n > 0 then
  denied, base = room_keys_refusal(KEYS, 1, n)
end
for j = 1, p do
  if not denied then
    denied, base = lease_refusal(base, KEYS[n + j], ARGV[j + 2])
  end
end
denied = denied or acl_refusal(SCRIPT, "hmget", KEYS[1])
if denied then
  return denied
end

local fields = {}
for j = 1, p do
  fields[j] = ARGV[j + 2]
end

local leases, epochs = {}, {}
local now = now_ms()
for j = 1, p do
  local record = redis.call("HMGET", KEYS[n + j], "state", "deadline", "epoch")
  epochs[j] = stored_int(record[3]) or 0  -- an epoch kvstatus does not write fences nothing (lua/lib/stored.lua)
  if not record[1] then
    leases[j] = 0
  elseif record[1] == "held" and now <= (stored_int(record[2]) or 0) then  -- a junk deadline: lost
    leases[j] = 1
  else
    leases[j] = 2
  end
end

-- Fields are read with explicit HMGET arguments, four at a time: unpack() of a table costs more
-- in Redis' Lua than the HMGET itself. One reader per arity, chosen once.
local call = redis.call
local f1, f2, f3, f4 = fields[1], fields[2], fields[3], fields[4]
local function chunk(key, from)
  local a, b, c, d = fields[from], fields[from + 1], fields[from + 2], fields[from + 3]
  local v = d and call("HMGET", key, a, b, c, d) or c and call("HMGET", key, a, b, c)
    or b and call("HMGET", key, a, b) or call("HMGET", key, a)
  return (v[1] or "-") .. (b and (v[2] or "-") or "") .. (c and (v[3] or "-") or "") .. (d and (v[4] or "-") or "")
end
local read
if p == 4 then
  read = function(key)
    local v = call("HMGET", key, f1, f2, f3, f4)
    return (v[1] or "-") .. (v[2] or "-") .. (v[3] or "-") .. (v[4] or "-")
  end
elseif p == 2 then
  read = function(key)
    local v = call("HMGET", key, f1, f2)
    return (v[1] or "-") .. (v[2] or "-")
  end
elseif p == 1 then
  read = function(key)
    return call("HGET", key, f1) or "-"
  end
else
  read = function(key)
    local code = chunk(key, 1)
    for from = 5, p, 4 do
      code = code .. chunk(key, from)
    end
    return code
  end
end

local find, codes, reasons, fates = string.find, {}, {}, {}
for i = 1, n do
  local key = KEYS[i]
  local code = read(key)
  -- The common case, one pattern match: p statuses 1..4 or missing. Otherwise validate and collect reasons.
  if #code ~= p or not find(code, "^[1-4-]+$") then
    for j = 1, p do
      local value = call("HGET", key, fields[j])
      if value and (#value ~= 1 or not find(value, "^[0-4]$")) then
        return redis.error_reply("KVSTATUS_CORRUPT key " .. key .. " field " .. fields[j] .. " holds "
          .. string.format("%q", string.sub(value, 1, 40)) .. ", not a status 0..4")
      end
      if value == "0" then
        local reason = call("HGET", key, "reason:" .. fields[j])
        if reason then
          reasons[#reasons + 1] = (i - 1) * p + j - 1
          reasons[#reasons + 1] = reason
        end
      end
    end
  end
  codes[i] = code
  if fate_field and find(code, "[0-3-]") then  -- not every entry at Success: the room's first failure counts
    local fate = call("HGET", key, fate_field)
    if fate then
      fates[#fates + 1] = i - 1
      fates[#fates + 1] = fate
    end
  end
end
return {leases, codes, reasons, epochs, fates}
