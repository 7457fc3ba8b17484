-- Keys that belong together ("-- @include keys" in every script that takes more than one key, but
-- get_many.lua: see there).
-- A script checks its keys before its first write, so a direct EVALSHA that mixes rooms or
-- namespaces writes nothing. Room keys are "<prefix>:<namespace>:{<room>}" (kvstatus/keys.py), all
-- of the namespace of the first one; a tombstone is its own room's key plus ":t" (same hash tag,
-- same slot); a lease record is "<prefix>:<namespace>:lease:<participant>" of the same namespace
-- and of the participant the script's arguments name.
-- Each function returns nil when the keys belong together, else a "KVSTATUS_BADARG <what>" error.

local ROOM_KEY = "^([%w_.%-]+:[%w_.%-]+:){%d+}$"  -- captures "<prefix>:<namespace>:"
local LEASE_KEY = "^([%w_.%-]+:[%w_.%-]+:)lease:[%w_.%-]+$"

local function keys_refusal(what)
  return redis.error_reply("KVSTATUS_BADARG keys do not belong together: " .. what)
end

-- keys[first..last] (the script's KEYS) are room keys of one namespace: returns the error, or nil and
-- "<prefix>:<namespace>:". keys[first] is matched in full; the others start with its "<prefix>:<namespace>:{"
-- and end with "}".
-- (Two plain calls per key cost ~0.19 us in Redis, a pattern match ~0.42 us: this loop runs per room.)
local function room_keys_refusal(keys, first, last)
  local base = string.match(keys[first], ROOM_KEY)
  if not base then
    return keys_refusal("key " .. keys[first] .. " is not a room key <prefix>:<namespace>:{<room>}")
  end
  local find, byte, head = string.find, string.byte, base .. "{"
  for i = first + 1, last do
    local key = keys[i]
    if find(key, head, 1, true) ~= 1 or byte(key, -1) ~= 125 then  -- 125: "}"
      return keys_refusal("key " .. key .. " is not a room key of the namespace of " .. keys[first])
    end
  end
  return nil, base
end

-- `tomb` is the tombstone of room key `room`.
local function tombstone_refusal(room, tomb)
  if tomb ~= room .. ":t" then
    return keys_refusal("key " .. tomb .. " is not the tombstone of room key " .. room .. " (" .. room .. ":t)")
  end
  return nil
end

-- `key` is the lease record of `participant` in namespace `base` ("<prefix>:<namespace>:"); base nil takes
-- the namespace of `key` itself. Returns the error, or nil and the namespace's base.
local function lease_refusal(base, key, participant)
  base = base or string.match(key, LEASE_KEY)
  if not base or key ~= base .. "lease:" .. participant then
    return keys_refusal("key " .. key .. " is not the lease record " .. (base or "<prefix>:<namespace>:")
      .. "lease:" .. participant .. " of participant " .. participant)
  end
  return nil, base
end
