#!lua flags=no-writes
--@prelude layout
-- status.lua: read the budgets of some levels without changing anything. The
-- Redis port of crates/core/src/budget/status.rs, held to it by tests/store/differential/;
-- state layout as in reserve.lua. build.rs prepends the constants in capitals
-- (crates/core/src/layout.rs) and clock_us().
--
-- KEYS[1..n]  level hashes, outermost first (only levels with a limit)
-- ARGV[1]  spec: little-endian doubles: n, then per level: concurrency limit (-1: none)
-- ARGV[2]  '<' followed by at least as many 'd' as the longest state or spec
-- ARGV[3]  '1': exact — a level of at most EXACT_LEASES leases is read whole (HGETALL)
--          for its real earliest expiry; '0': only once the stored (lower
--          bound) expiry has passed
--
-- Returns {now, then per level: state, live leases, earliest live lease expiry
-- (us, 0: none)}; a state is '' for a level never written. Expired leases are
-- counted out but not reclaimed. The caller computes readings from the states.

local now = clock_us()
local D = ARGV[@[status_argv.doubles]]
local exact = ARGV[@[status_argv.exact]] == '1'
-- A spec longer than D (a plan of more buckets than D covers) gets its own format.
local nspec = #ARGV[@[status_argv.spec]] / 8
local sfmt = string.sub(D, 1, nspec + 1)
if nspec >= #D then sfmt = '<' .. string.rep('d', nspec) end
local spec = {struct.unpack(sfmt, ARGV[@[status_argv.spec]])}
local out = {now}
for i = 1, spec[@[status.levels]] do
  local raw = redis.call('HGET', KEYS[i], 's') or ''
  local n, e = 0, 0
  if raw ~= '' then n, e = struct.unpack('<dd', raw) end
  if spec[@{status} + i] >= 0 and n > 0 and ((exact and n <= EXACT_LEASES) or (e > 0 and now >= e)) then
    -- Count the live leases and find the real earliest expiry (the stored one
    -- is a lower bound after the earliest lease was settled or renewed).
    local all = redis.call('HGETALL', KEYS[i])
    n, e = 0, 0
    for j = 1, #all, 2 do
      if string.byte(all[j]) == 35 then -- '#'
        local x = struct.unpack('<d', all[j + 1])
        if x > now then
          n = n + 1
          if e == 0 or x < e then e = x end
        end
      end
    end
  end
  out[#out + 1] = raw
  out[#out + 1] = n
  out[#out + 1] = e
end
return out
