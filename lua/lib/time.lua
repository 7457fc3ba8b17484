-- Time in kvstatus scripts ("-- @include time"): TTL arguments, Redis' clock, and TTLs that are
-- never shortened.
--
-- One TTL per room key, shared by its participants, and a write never shortens it: the key's TTL
-- becomes max(TTL left, ttl), a key without TTL counting as 0. Redis >= 7 does it with PEXPIRE
-- NX / GT, in one call when the first flag fits: NX for a key this call probably created (no TTL
-- yet), else GT; the other flag follows when the first set nothing, and either order ends the same.
-- GT alone would never give a TTL to a key that has none: Redis counts that as infinite. Older
-- servers (no REDIS_VERSION_NUM, no flags) compare with PTTL first.
local EXPIRE_FLAGS = redis.REDIS_VERSION_NUM ~= nil

-- Whether `value` (an ARGV string) is a positive integer of milliseconds, at most 15 digits.
local function positive_ms(value)
  return type(value) == "string" and string.match(value, "^[1-9][0-9]*$") ~= nil and #value <= 15
end

-- Redis' clock in whole Unix milliseconds (TIME).
local function now_ms()
  local time = redis.call("TIME")
  return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end
