-- A participant's lease: acquire, renew or release it, atomically, against Redis' own clock.
-- kvstatus/_async/leases.py (the keeper) keeps it alive; the consensus read (kvstatus/rule.py) and the sweeper
-- read it (lua/room_statuses.lua).
--
-- KEYS[1]  the lease record, a hash: <prefix>:<namespace>:lease:<participant>
-- ARGV[1]  "acquire", "renew", "release" or "expire" (a peer watch's, below: then ARGV[2] and ARGV[3] only)
-- ARGV[2]  the holder's incarnation: a random token, new for every acquire
-- ARGV[3]  lease TTL in milliseconds, a positive integer
-- ARGV[4]  how long the record is kept after its last renewal, in milliseconds (>= the lease TTL):
--          an expired lease stays visible as "lost" that long, so its rooms can be found and swept
-- ARGV[5]  optional, acquire only: the address by which peers reach the holder ("host:port", no whitespace;
--          kvstatus/peerwatch.py matches it against the address a room waits on). Absent or "": the record has none
-- ARGV[6]  optional, acquire only: who holds it, for the operator and a refused twin ("host:pid", 1..300
--          characters, no whitespace). Absent or "": the record has none
--
-- "expire": ARGV[2] the incarnation and ARGV[3] the "seen" a peer watch read in the record, unchanged since for
-- longer than the lease TTL by the watch's own monotonic clock (kvstatus/peerwatch.py): the holder stopped renewing.
-- If the record still names that incarnation, held, with that "seen", its state becomes "expired": lost for good,
-- whatever Redis' clock says (a clock stepped back would keep it alive the step longer). Returns LOST when the
-- lease is lost (by this call, or before), HELD when it was renewed since (nothing written).
--
-- Record fields: inc (incarnation), gen (how many incarnations so far), epoch (the incarnation's fence:
-- Unix ms at its acquire by the server's clock, and always above the previous incarnation's, so an epoch
-- orders the incarnations of a name even after a lost record restarted gen), since, seen and deadline
-- (Unix ms, server clock), ttl (ms), state ("held", "released" or "expired"), addr (the incarnation's address, if any),
-- holder (host:pid, if given). The lease is alive while
-- state is "held" and the server's time is <= deadline; once that is false it is lost for good:
-- renewing it again answers LOST, and only a new incarnation (acquire) holds the name again.
--
-- Returns {code, gen, epoch}, integers only. code, kvstatus.model.LeaseOutcome: HELD (acquired or renewed),
-- LOST (the record names another incarnation, was released, or its deadline passed: nothing
-- written), RELEASED. gen and epoch are the record's (0 when there is none).
-- Errors, raised before the first write:
--   "KVSTATUS_BADARG <what>"  malformed arguments
--   "NOPERM <what>"           the ACL refuses a command this script runs (see acl_refusal)

local HELD, LOST, RELEASED = 10, 11, 12
local SCRIPT = "lease"

-- @include acl
-- @include time
-- @include stored

local key, op, inc, ttl, keep, address, holder = KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
if address == "" then
  address = nil
end
if holder == "" then
  holder = nil
end
if #KEYS ~= 1 or (op ~= "acquire" and op ~= "renew" and op ~= "release" and op ~= "expire") then
  return redis.error_reply("KVSTATUS_BADARG expected one key and an operation acquire, renew, release or expire")
end
if #ARGV > 6 or (address and (op ~= "acquire" or not string.match(address, "^[^%s]+:[0-9]+$") or #address > 300)) then
  return redis.error_reply("KVSTATUS_BADARG the address (acquire only) must be host:port, without whitespace")
end
if holder and (op ~= "acquire" or not string.match(holder, "^[^%s]+$") or #holder > 300) then
  return redis.error_reply("KVSTATUS_BADARG the holder (acquire only) must be 1..300 characters, without whitespace")
end
if type(inc) ~= "string" or not string.match(inc, "^[0-9a-f]+$") or #inc > 64 then
  return redis.error_reply("KVSTATUS_BADARG the incarnation must be 1..64 hex digits")
end
-- The record's `field`, its generation and epoch, and {LOST, gen, epoch} when this incarnation does not hold it.
local function held_record(field)
  local record = redis.call("HMGET", key, "inc", "state", field, "gen", "epoch")
  local gen, epoch = tonumber(record[4]) or 0, stored_int(record[5]) or 0
  if record[1] ~= inc or record[2] ~= "held" then
    return record[3], gen, epoch, {LOST, gen, epoch}
  end
  return record[3], gen, epoch, nil
end

if op == "expire" then
  if #ARGV ~= 3 or not stored_int(ttl) then
    return redis.error_reply("KVSTATUS_BADARG expire takes the incarnation and the renewal time (\"seen\") it read")
  end
  local denied = acl_refusal(SCRIPT, "hset", key)
  if denied then
    return denied
  end
  local seen, gen, epoch, lost = held_record("seen")
  if lost then
    return lost
  end
  if seen ~= ttl then  -- ARGV[3]: the "seen" it read
    return {HELD, gen, epoch}
  end
  redis.call("HSET", key, "state", "expired")
  return {LOST, gen, epoch}
end
if not positive_ms(ttl) or not positive_ms(keep) or tonumber(keep) < tonumber(ttl) then
  return redis.error_reply("KVSTATUS_BADARG lease TTL and keep time must be positive integers of ms, keep >= TTL")
end

local denied = acl_refusal(SCRIPT, "hset", key) or acl_refusal(SCRIPT, "pexpire", key)
  or acl_refusal(SCRIPT, "time", key)
  or (op == "acquire" and (acl_refusal(SCRIPT, "hincrby", key) or acl_refusal(SCRIPT, "hget", key)
    or acl_refusal(SCRIPT, "hdel", key)))
if denied then
  return denied
end

local now = now_ms()
local deadline = now + tonumber(ttl)

if op == "acquire" then
  local gen = redis.call("HINCRBY", key, "gen", 1)
  -- The previous epoch counts only if it is one lua/update.lua takes (lua/lib/stored.lua) and has a successor that
  -- is one too: a forged "1e300" or 999999999999999 would otherwise make every later acquire take an epoch
  -- that every write refuses. Such a value is read as none, and this acquire takes Redis' clock.
  local previous = stored_int(redis.call("HGET", key, "epoch"))
  local epoch = (previous and previous < STORED_MAX_INT) and math.max(now, previous + 1) or now
  redis.call("HSET", key, "inc", inc, "epoch", epoch, "state", "held", "since", now, "seen", now,
    "deadline", deadline, "ttl", ttl)
  if address then
    redis.call("HSET", key, "addr", address)
  else
    redis.call("HDEL", key, "addr")
  end
  if holder then
    redis.call("HSET", key, "holder", holder)
  else
    redis.call("HDEL", key, "holder")
  end
  redis.call("PEXPIRE", key, keep)
  return {HELD, gen, epoch}
end

local held_until, gen, epoch, lost = held_record("deadline")
if lost then
  return lost
end
if op == "release" then
  redis.call("HSET", key, "state", "released", "seen", now, "deadline", now)
  redis.call("PEXPIRE", key, keep)
  return {RELEASED, gen, epoch}
end
if now > (tonumber(held_until) or 0) then
  return {LOST, gen, epoch}
end
redis.call("HSET", key, "seen", now, "deadline", deadline)
redis.call("PEXPIRE", key, keep)
return {HELD, gen, epoch}
