#!lua
--@wrap reserve reserve_one
-- reserve_first.lua: CheckAndReserve with fallback candidates in one call:
-- lua/reserve.lua run on each candidate's KEYS and ARGV in order until one is
-- allowed. build.rs puts reserve.lua's prelude and reserve_one(KEYS, ARGV),
-- reserve.lua's body as a function, before this driver; each candidate is
-- thus exactly one reserve.lua call, the candidates one atomic step.
--
-- KEYS     each candidate's KEYS (as reserve.lua takes them), one after the other
-- ARGV[1]  c, the number of candidates
-- ARGV[2 .. 1 + 2c]  per candidate: how many KEYS, how many ARGV it has
-- then     each candidate's ARGV (as reserve.lua takes them), one after the other
--
-- Returns {i, reply 1, ..., reply i}: i the candidate allowed (0: none), and
-- reserve.lua's reply for each candidate tried, the allowed one last. A
-- denied candidate changes nothing (but the lapsed leases it reclaimed), so
-- a later one finds the levels as the call found them.

local n = tonumber(ARGV[@[reserve_first_argv.candidates]])
local out = {0}
local k, a = 0, @{reserve_first_argv} + @{reserve_first_sizes} * n
for c = 1, n do
  local at = @{reserve_first_argv} + @{reserve_first_sizes} * (c - 1)
  local nk, na = tonumber(ARGV[at + @[reserve_first_sizes.keys]]), tonumber(ARGV[at + @[reserve_first_sizes.args]])
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, na do args[i] = ARGV[a + i] end
  k, a = k + nk, a + na
  local r = reserve_one(keys, args)
  out[c + 1] = r
  if r[1] == REPLY_ALLOWED then
    out[1] = c
    return out
  end
end
return out
