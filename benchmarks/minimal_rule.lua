-- The floor of the data model, for the benchmarks only: the seed update rule
-- with nothing else. Per key one HGET, an HSET when the entry changes, and a
-- PEXPIRE; no argument validation, no ACL check, no strict policy.
--
-- KEYS[i]    room hash
-- ARGV[1]    TTL in milliseconds
-- ARGV[2]    the participant's status field
-- ARGV[2+i]  new status for KEYS[i], "0".."4"
--
-- Returns {outcome_1, status_1, ...} with kvstatus' outcome numbers, like lua/update.lua.

local ttl, field = ARGV[1], ARGV[2]
local result = {}
for i = 1, #KEYS do
  local key, s = KEYS[i], tonumber(ARGV[2 + i])
  local cur = redis.call("HGET", key, field)
  local outcome, after
  if not cur then
    if s == 0 then outcome, after = 5, -1 else outcome, after = 1, s end
  else
    cur = tonumber(cur)
    if s == 0 then
      if cur == 0 then outcome, after = 4, 0 else outcome, after = 3, 0 end
    elseif s > cur then
      outcome, after = 2, s
    else
      outcome, after = 4, cur
    end
  end
  if outcome <= 3 then
    redis.call("HSET", key, field, s)
  end
  if outcome <= 4 then
    redis.call("PEXPIRE", key, ttl)
  end
  result[2 * i - 1] = outcome
  result[2 * i] = after
end
return result
