-- kvstatus update rule, applied atomically to one participant's entry in each
-- room hash named in KEYS. kvstatus/rule.py:apply_rule is the same table in
-- Python; the tests hold the two together.
--
-- KEYS[i]    room hash of the i-th room, i = 1..n (n = #ARGV - 7)
-- KEYS[n+i]  optional (then exactly n of them): the i-th room's tombstone (lua/clear.lua). Sent only
--            with a Failed update; a Failed that finds no entry (IGNORED_MISSING) while the
--            tombstone records this participant's clear notes "late:<participant>" there.
--            More than one key must belong together (lua/lib/keys.lua): room keys of one namespace,
--            each tombstone its own room's.
-- ARGV[1]    policy: "seed" or "strict"
-- ARGV[2]    TTL in milliseconds, a positive integer
-- ARGV[3]    the participant's status field
-- ARGV[4]    the participant's failure-reason field
-- ARGV[5]    the participant's incarnation field ("inc:<participant>")
-- ARGV[6]    the writer's incarnation epoch (lua/lease.lua), a positive integer; "" for a writer without a
--            lease, which neither reads nor writes incarnations
-- ARGV[7]    the participant's timeline field ("t:<participant>", lua/lib/timeline.lua), or "": no timeline
-- ARGV[7+i]  new status for KEYS[i], "0".."4"
--
-- Returns {outcome_1, status_1, outcome_2, status_2, ...}, integers only:
--   outcome  kvstatus.model.Outcome (the constants below)
--   status   the entry's status afterwards, 0..4, or -1 when there is no entry (REFUSED_SUPERSEDED: as it is)
-- Errors, raised before the first write, so nothing is half-written:
--   "KVSTATUS_BADARG <what>"   malformed arguments, or keys that do not belong together
--   "KVSTATUS_CORRUPT <what>"  a stored status is not "0".."4"; it is left as it is. A stamp or a timeline
--                              kvstatus does not write (lua/lib/stored.lua's rule, kvstatus.replies') is
--                              read as none: the write replaces it with its own
--   "NOPERM <what>"            the ACL refuses a write this call would make (see acl_refusal)
-- CREATED, ADVANCED, FAILED and UNCHANGED refresh the room's TTL to at least ARGV[2] (never shorter than
-- what another writer left, see EXPIRE_FLAGS in lua/lib/time.lua); the others write nothing.
-- FAILED also records the room's first failure (lua/lib/fate.lua) unless it has one: stage from the entry's
-- status before, origin the participant, reason its recorded failure reason ("" when none yet; a
-- record_failure after the update fills it in). A user the ACL denies HSETNX or TIME gets the Failed
-- stored without the record.
-- With a timeline field, CREATED starts the entry's timeline (replacing any left there) and ADVANCED and
-- FAILED append a step to it (or start it anew over a value that is not a timeline), at Redis' clock
-- (TIME), in the HSET that stores the status.
-- It publishes nothing: wait_for learns of a change from CLIENT TRACKING (kvstatus/_async/store.py).
--
-- Fencing (a writer with an epoch): an entry carries the epoch of the incarnation that last wrote or touched
-- it. A write from an older epoch is REFUSED_SUPERSEDED and writes nothing: the participant restarted under
-- the same name, and the old process must not overwrite the new one's entry. An entry stamped with an older
-- epoch is a previous incarnation's: the rule sees it as missing (a restarted process starts with an empty
-- dict), so a CREATED replaces it (and drops its reason) and a Failed leaves it. Any outcome that writes or
-- touches the entry (CREATED .. UNCHANGED) stamps it with the writer's epoch.

local CREATED, ADVANCED, FAILED, UNCHANGED = 1, 2, 3, 4
local IGNORED_MISSING, REFUSED_TERMINAL, REFUSED_CREATE, REFUSED_SUPERSEDED = 5, 6, 7, 15
local STATUS_FAILED, STATUS_WAITING_FOR_INPUT = 0, 2
local byte = string.byte
local ZERO = byte("0")  -- a status is one character, "0".."4"
local SCRIPT = "update"

-- @include acl
-- @include time
-- @include fate
-- @include stored
-- @include timeline

local policy, ttl, field, reason_field, inc_field, epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local tl_field = ARGV[7]

if policy ~= "seed" and policy ~= "strict" then
  return redis.error_reply("KVSTATUS_BADARG policy must be seed or strict")
end
if not positive_ms(ttl) then
  return redis.error_reply("KVSTATUS_BADARG TTL must be a positive integer of milliseconds")
end
if not field or field == "" or not reason_field or reason_field == "" or not inc_field or inc_field == ""
    or not tl_field then
  return redis.error_reply("KVSTATUS_BADARG participant fields must be non-empty")
end
if tl_field == "" then
  tl_field = nil
end
local stamp_arg = epoch  -- written as sent: a number would be formatted by Lua
if epoch == "" then
  epoch = nil
else
  -- The rule every reader of a stamp applies (lua/lib/stored.lua), so a stamp written is a stamp read back.
  epoch = stored_int(epoch)
  if not epoch then
    return redis.error_reply("KVSTATUS_BADARG the incarnation epoch must be empty or a positive integer of"
      .. " 1..15 digits")
  end
end
local n = #ARGV - 7
if n < 1 or (#KEYS ~= n and #KEYS ~= 2 * n) then
  return redis.error_reply("KVSTATUS_BADARG expected one status per key, and at least one key")
end
local tombs, late = #KEYS == 2 * n, nil
if n > 1 or tombs then  -- keys that belong together; a call of one key (the hot path) defines none of this
  -- @include keys
  local refused = room_keys_refusal(KEYS, 1, n)
  for i = 1, tombs and n or 0 do
    refused = refused or tombstone_refusal(KEYS[i], KEYS[n + i])
  end
  if refused then
    return refused
  end
end

-- First pass: validate, read, apply the rule, and ask the ACL about every write
-- the second pass will make; nothing is written yet. PEXPIRE is checked on every
-- key that will be written, so no key can be left without its TTL whatever the
-- ACL. HSET and HDEL are checked once per call, on the first key that needs them:
-- a user's own ACL rules allow a command on a key when the command is allowed
-- (the same for every key) and the key matches its patterns (the same for HSET,
-- HDEL and PEXPIRE, which all need read-write access), so the PEXPIRE check of
-- each key covers them too and nothing is half-written. (ACL selectors can grant
-- HSET and PEXPIRE on different keys; there a batch could stop half way, but
-- never leave a key without TTL.) One check per key instead of three.
local result, leaves_failed, stage_of, stamp_of = {}, nil, nil, nil
local fate_ok = nil  -- whether the ACL lets this user record the room's first failure; asked once
local hset_checked, denied = false, nil
local timeline_of, now = nil, nil  -- each written entry's new timeline; Redis' clock, read once
for i = 1, n do
  local key, arg = KEYS[i], ARGV[7 + i]
  local s = #arg == 1 and byte(arg) - ZERO
  if not s or s < 0 or s > 4 then
    return redis.error_reply("KVSTATUS_BADARG status for key " .. key .. " must be 0..4")
  end
  local stored, stamp, timeline, newer, older = nil, nil, nil, false, false
  if tl_field then
    local all = epoch and redis.call("HMGET", key, field, tl_field, inc_field) or redis.call("HMGET", key, field, tl_field)
    stored, timeline, stamp = all[1], all[2], all[3]
  elseif epoch then
    local both = redis.call("HMGET", key, field, inc_field)
    stored, stamp = both[1], both[2]
  else
    stored = redis.call("HGET", key, field)
  end
  if epoch then
    if stamp and stamp ~= stamp_arg then  -- strings are interned: equal stamps (the common case) cost no parse
      -- A stamp kvstatus does not write ("inf", "1e400", "-5", " 7", a 16-digit number) fences nothing: it is
      -- read as no stamp, and this write replaces it with its own.
      local value = stored_int(stamp)
      if value then
        newer, older = value > epoch, value < epoch
      end
    end
  end
  local cur = false
  if stored then
    cur = #stored == 1 and byte(stored) - ZERO
    if not cur or cur < 0 or cur > 4 then
      return redis.error_reply("KVSTATUS_CORRUPT key " .. key .. " field " .. field
        .. " holds " .. string.format("%q", string.sub(stored, 1, 40)) .. ", not a status 0..4")
    end
    if older then
      cur = false  -- a previous incarnation's entry: this one has none (a restarted process' dict is empty)
    end
  end
  local outcome, after
  if newer then
    outcome, after = REFUSED_SUPERSEDED, cur or -1
  elseif not cur then
    if s == STATUS_FAILED then
      outcome, after = IGNORED_MISSING, -1
      -- The note is best effort: a user the ACL denies any of it gets the outcome without the note.
      local tomb = tombs and KEYS[n + i]
      if tomb and not (acl_refusal(SCRIPT, "hexists", tomb) or acl_refusal(SCRIPT, "hsetnx", tomb)
        or acl_refusal(SCRIPT, "time", tomb))
          and redis.call("HEXISTS", tomb, field) == 1 then
        late = late or {}
        late[i] = true
      end
    elseif policy == "strict" and s > STATUS_WAITING_FOR_INPUT then
      outcome, after = REFUSED_CREATE, -1
    else
      outcome, after = CREATED, s
    end
  elseif s == STATUS_FAILED then
    if cur == STATUS_FAILED then
      outcome, after = UNCHANGED, cur
    else
      outcome, after = FAILED, s
    end
  elseif cur == STATUS_FAILED and policy == "strict" then
    outcome, after = REFUSED_TERMINAL, cur
  elseif s > cur then
    outcome, after = ADVANCED, s
  else
    outcome, after = UNCHANGED, cur
  end
  if epoch and outcome <= UNCHANGED and stamp ~= stamp_arg then
    stamp_of = stamp_of or {}
    stamp_of[i] = true
  end
  if (outcome < UNCHANGED or (stamp_of and stamp_of[i])) and not hset_checked then
    denied, hset_checked = acl_refusal(SCRIPT, "hset", key), true
  end
  if (outcome == ADVANCED and cur == STATUS_FAILED) or (outcome == CREATED and older and stored) then
    -- A seed-policy entry leaving Failed drops the reason of the failure it left; so does an entry that
    -- replaces a previous incarnation's.
    if not leaves_failed then
      leaves_failed, denied = {}, denied or acl_refusal(SCRIPT, "hdel", key)
    end
    leaves_failed[i] = true
  end
  if tl_field and outcome < UNCHANGED then
    -- Redis' clock, read in this first pass: an ACL that refuses TIME stops the script before any write.
    now = now or now_ms()
    -- A timeline kvstatus does not write (lua/lib/stored.lua: steps that go back, 16-digit times, over 160
    -- bytes) is replaced by a new one from this step: it only informs, so it never stops a write.
    local after_tl = timeline_after(outcome ~= CREATED and timeline or nil, after, now)
      or timeline_after(nil, after, now)
    timeline_of = timeline_of or {}
    timeline_of[i] = after_tl
  end
  if outcome == FAILED then
    if fate_ok == nil then
      fate_ok = fate_refusal(SCRIPT, key) == nil  -- a refusal only skips the record: the Failed itself is stored
    end
    stage_of = stage_of or {}
    stage_of[i] = fate_ok and STAGE_OF_STATUS[cur]
  end
  if outcome <= UNCHANGED then
    denied = denied or acl_refusal(SCRIPT, "pexpire", key)
  end
  if denied then
    return denied
  end
  result[2 * i - 1] = outcome
  result[2 * i] = after
end

-- Second pass: write. CREATED, ADVANCED and FAILED store the status; those and
-- UNCHANGED refresh the TTL (never shorter than another writer's, see EXPIRE_FLAGS in lua/lib/time.lua).
for i = 1, n do
  local outcome = result[2 * i - 1]
  if outcome <= UNCHANGED then
    local key = KEYS[i]
    local stamped = stamp_of and stamp_of[i]
    if outcome < UNCHANGED then
      local timeline = timeline_of and timeline_of[i]  -- in the status' HSET: atomic with it
      if stamped and timeline then
        redis.call("HSET", key, field, result[2 * i], tl_field, timeline, inc_field, stamp_arg)
      elseif stamped then
        redis.call("HSET", key, field, result[2 * i], inc_field, stamp_arg)
      elseif timeline then
        redis.call("HSET", key, field, result[2 * i], tl_field, timeline)
      else
        redis.call("HSET", key, field, result[2 * i])
      end
      if leaves_failed and leaves_failed[i] then
        redis.call("HDEL", key, reason_field)
      end
      if stage_of and stage_of[i] then
        record_fate(key, stage_of[i], field, redis.call("HGET", key, reason_field))
      end
    elseif stamped then
      redis.call("HSET", key, inc_field, stamp_arg)
    end
    if EXPIRE_FLAGS then  -- inline, not a function: this loop is the hot path
      local fresh = outcome == CREATED
      if redis.call("PEXPIRE", key, ttl, fresh and "NX" or "GT") == 0 then
        redis.call("PEXPIRE", key, ttl, fresh and "GT" or "NX")
      end
    elseif redis.call("PTTL", key) < tonumber(ttl) then
      redis.call("PEXPIRE", key, ttl)
    end
  elseif late and late[i] then
    redis.call("HSETNX", KEYS[n + i], "late:" .. field, now_ms())
  end
end
return result
