-- bucket_crossings: first passes the thresholds of buckets the call did not
-- move (settle.lua moves only some); then, when the bucket at place `seen + b`
-- of the plan is the next with alert thresholds (`alert_next`, its entry at
-- `alert_at` of `alert_spec`: place, count k, k basis points ascending), adds to
-- `crossings` each threshold its move from level `l` to `l - c` crosses
-- upward ({level i, bucket id, limit lim, use after, basis points, window
-- start ws}; none when it ends below the lowest), and moves to the next
-- entry. The Rust definition is `domain::budget::alerts::crossed`; the rest
-- of the step is lua/alerts.lua.
-- build.rs splices this file where reserve.lua, settle.lua and charge.lua
-- say `--@splice bucket_crossings`.
while alert_next ~= 0 and alert_next < seen + b do
  alert_at = alert_at + 2 + alert_spec[alert_at + 1]
  alert_next = alert_spec[alert_at] or 0
end
if seen + b == alert_next then
  local k, used = alert_spec[alert_at + 1], lim - (l - c)
  if used >= alert_spec[alert_at + 2] / 10000 * lim then
    for a = alert_at + 2, alert_at + 1 + k do
      local bp = alert_spec[a]
      local t = bp / 10000 * lim
      if lim - l < t and used >= t then
        crossings = crossings or {}
        crossings[#crossings + 1] = {i, id, lim, used, bp, ws}
      end
    end
  end
  alert_at = alert_at + 2 + k
  alert_next = alert_spec[alert_at] or 0
end
