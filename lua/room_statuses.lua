#!lua flags=no-writes
-- The consensus read of many rooms over expected participants, in one command (single Redis).
-- kvstatus/consensus.py turns the reply into each room's RoomConsensus; on a cluster it reads the
-- same data with one HMGET per room and this script once per lease key (ARGV[1] = "0").
--
-- KEYS[1..n]      room hashes
-- KEYS[n+1..n+p]  lease records of the p participants, in ARGV order (lua/lease.lua)
-- ARGV[1]         n, the number of rooms
-- ARGV[2..p+1]    participant names (status fields)
--
-- Returns {leases, statuses, reasons}:
--   leases    p integers: 0 the participant never held a lease (no record), 1 alive, 2 lost
--             (released, or the deadline passed by the server's clock)
--   statuses  n*p values, room-major: the stored status string, or nil where there is no entry
--   reasons   {k, reason, ...}: for each Failed ("0") value k (1-based index into statuses), its
--             failure reason (reason:<participant>), when one is recorded
-- Validation of stored values happens in the client, which names the corrupted key.
-- Errors: "KVSTATUS_BADARG <what>"; "NOPERM <what>" when the ACL refuses HMGET on the first key.

local SCRIPT = "room_statuses"

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

local n = tonumber(ARGV[1])
local p = #ARGV - 1
if not n or n < 0 or n % 1 ~= 0 or p < 1 or #KEYS ~= n + p then
  return redis.error_reply("KVSTATUS_BADARG expected n room keys then one lease key per participant")
end
local denied = #KEYS > 0 and acl_refusal("hmget", KEYS[1])
if denied then
  return denied
end

local fields = {}
for j = 1, p do
  fields[j] = ARGV[j + 1]
end

local leases = {}
local time = redis.call("TIME")
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
for j = 1, p do
  local record = redis.call("HMGET", KEYS[n + j], "state", "deadline")
  if not record[1] then
    leases[j] = 0
  elseif record[1] == "held" and now <= (tonumber(record[2]) or 0) then
    leases[j] = 1
  else
    leases[j] = 2
  end
end

local statuses, reasons, k = {}, {}, 0
for i = 1, n do
  local values = redis.call("HMGET", KEYS[i], unpack(fields))
  for j = 1, p do
    local value = values[j]
    statuses[k + j] = value
    if value == "0" then
      local reason = redis.call("HGET", KEYS[i], "reason:" .. fields[j])
      if reason then
        reasons[#reasons + 1] = k + j
        reasons[#reasons + 1] = reason
      end
    end
  end
  k = k + p
end
return {leases, statuses, reasons}
