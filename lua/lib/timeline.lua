-- Each entry's timeline ("-- @include timeline"; needs "-- @include time" and "-- @include stored" above it).
-- The room field "t:<participant>" holds the server time at which the participant's entry reached each
-- status. The script that changes the status writes it in the same HSET, so no crash can separate the two.
-- Format (kvstatus/timeline.py reads it and is the Python reference of timeline_after):
--   "<status>@<unix ms>" for the first step, then " <status>+<ms since the first step>" for each later one,
--   e.g. "1@1764680000123 2+15 3+40 4+52".
-- A step's offset is never below the previous step's (Redis' clock can step back, after a failover for
-- one), so every timeline is monotone by construction. A step that would make the value longer than
-- TIMELINE_MAX_BYTES is dropped: a seed-policy entry flipping between Failed and Success stays bounded.

local TIMELINE_MAX_BYTES = 160

-- `prev` (a timeline, or nil for none) with the step `status` (0..4) at `now` (unix ms) appended.
-- Returns the new value, or nil when `prev` is not a timeline by lua/lib/stored.lua's rule (which this file
-- needs above it), the same rule kvstatus/timeline.py reads with: the caller raises KVSTATUS_CORRUPT, or
-- leaves the value as it is.
local function timeline_after(prev, status, now)
  if not prev then
    return status .. "@" .. now
  end
  local base, last = stored_timeline(prev, TIMELINE_MAX_BYTES)
  if not base then
    return nil
  end
  local offset = now - base
  if offset < last then
    offset = last
  end
  local step = " " .. status .. "+" .. offset
  if #prev + #step > TIMELINE_MAX_BYTES then
    return prev
  end
  return prev .. step
end

