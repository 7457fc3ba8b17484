-- The room's first failure ("-- @include fate"; needs "-- @include acl" and "-- @include time" above it).
-- One field of the room hash, FATE_FIELD, holds "<unix ms>:<stage>:<origin>:<reason>" (kvstatus/replies.py
-- reads it): written once per room, by the first script that fails an entry or cancels the room; a
-- later failure keeps it (first root cause wins). Readers with shared fate on answer Failed for every
-- open entry of a room that has one (kvstatus.rule.shared_status).
-- Stages (kvstatus.model.Stage): the failing entry's status before it failed, or what failed it.

local FATE_FIELD = "room:fate"
local STAGE_OF_STATUS = {[1] = "bootstrap", [2] = "waiting", [3] = "transfer", [4] = "transfer"}

-- Record the room's first failure in `key` unless it has one; returns 1 if written, 0 if an earlier one is kept.
-- The caller has asked the ACL for HSETNX and TIME on `key` before its first write.
local function record_fate(key, stage, origin, reason)
  return redis.call("HSETNX", key, FATE_FIELD, now_ms() .. ":" .. stage .. ":" .. origin .. ":" .. (reason or ""))
end

-- The ACL refusal of what record_fate runs on `key`, or nil (`script`: as acl_refusal's).
local function fate_refusal(script, key)
  return acl_refusal(script, "hsetnx", key) or acl_refusal(script, "time", key)
end
