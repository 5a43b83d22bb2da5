#!lua
--@prelude layout state level alerts denied
-- charge.lua: take requests or tokens at every level with no reservation
-- behind them (no record, no lease). The Redis port of
-- crates/core/src/budget/charge.rs, held to it by tests/store/differential/; state
-- layout as in reserve.lua. build.rs prepends the constants in capitals
-- (crates/core/src/layout.rs), clock_us(), lua/state.lua, lua/level.lua
-- and lua/alerts.lua, and splices lua/splice/window_now.lua, bucket_level.lua
-- and bucket_crossings.lua.
--
-- KEYS[1..n]  level hashes, outermost first
-- ARGV[1]  spec: little-endian doubles: n, enforce (1 or 0) (calls.rs CHARGE),
--          the cost vector (a double per rate dimension by its code,
--          crates/core/src/dimension.rs: what a bucket of it takes), then per level: bucket count b, the key's longest life past this write
--          (us, as in reserve.lua), then b times: id, limit (a calendar
--          window's three more doubles after its limit, as in reserve.lua)
--          A bucket takes its dimension's place of the cost vector.
--          Enforced, a bucket denies when it would keep less than 0 after taking
--          max(cost, 1) (a check needs room); forced, nothing denies (debt).
-- ARGV[2]  '<' followed by at least as many 'd' as the longest state or spec
-- ARGV[3]  the struct format of ARGV[1]
-- ARGV[4..3+n]  the struct format of each level's state as this call's buckets make it
-- ARGV[4+n], ARGV[5+n]  when some bucket has alert thresholds: their spec
--          (alerts.lua), and the tenant's record key prefix (whose queue takes
--          a crossing: alerts.lua)
--
-- Returns
--   (tags REPLY_ALLOWED 1 and REPLY_DENIED 0, from crates/core/src/layout.rs)
--   {1, now, state...}        charged (or, a cost of 0, checked: nothing written);
--                             each level's state after (a cluster's reply that
--                             queued an alert ends with 'A<now>': alerts.lua)
--   {0, now, state..., mask}  denied; nothing changed; mask as in reserve.lua
-- A state is '' for a level never written. Concurrency leases are not touched.
--
-- The bucket read is lua/splice/bucket_level.lua, spliced inline by build.rs
-- (as a shared function it cost 1.8% more Redis instructions per call).

local now = clock_us()
local D = ARGV[@[charge_argv.doubles]]
local spec = {struct.unpack(ARGV[@[charge_argv.spec_format]], ARGV[@[charge_argv.spec]])}
local nlev, enforce = spec[@[charge.levels]], spec[@[charge.enforce]] == 1
-- The cost vector: spec[C + code] is what a bucket of that dimension takes.
local C = @[charge] - 1
local nothing = true
for k = 1, DIMS do
  if spec[C + k] ~= 0 then nothing = false end
end
local raws, states, ttls = {}, {}, {}
local dm, ci, denied = denied_words(), 0, false
-- Alert thresholds: the place of the next bucket that has some (0: none),
-- its entry at alert_at (as in reserve.lua).
local alert_spec, alert_at, alert_next, crossings = nil, 2, 0, nil
local alerts_at = @[charge_argv] + nlev
if ARGV[alerts_at] then
  alert_spec = {struct.unpack(fmt_of(D, #ARGV[alerts_at] / 8), ARGV[alerts_at])}
  alert_spec[#alert_spec] = nil -- struct.unpack's last value is the next read position
  alert_next = alert_spec[2]
end
local p, seen = @[charge] + DIMS, 0
for i = 1, nlev do
  local nb = spec[p + @{charge_level.buckets}]
  local raw = redis.call('HGET', KEYS[i], 's')
  local s
  local fmt = ARGV[@{charge_argv} + i]
  if raw then
    if #raw ~= (#fmt - 1) * 8 then fmt = fmt_of(D, #raw / 8) end
    s = {struct.unpack(fmt, raw)}
    s[#s] = nil
    if s[4] ~= STATE_V then s = upgrade(s) end
  else
    raw, s = '', {0, 0, 0, STATE_V}
  end
  local ns, ttl = #s, 0
  local q = p + @{charge_level}
  for b = 1, nb do
    local id, lim = spec[q + @{bucket.id}], spec[q + @{bucket.limit}]
    --@splice window_now
    local k = FIRST_BUCKET + (b - 1) * BUCKET_WIDTH
    if s[k] ~= id then
      k = nil
      for j = FIRST_BUCKET, ns - 3, BUCKET_WIDTH do
        if s[j] == id then k = j break end
      end
    end
    --@splice bucket_level
    local c = spec[C + (id % GROUP - pd) / DIM]
    local need = c
    if need < 1 then need = 1 end
    if enforce and l - need < 0 then
      local w = (ci - ci % 32) / 32 + 1
      dm[w] = dm[w] + 2 ^ (ci % 32)
      denied = true
    end
    ci = ci + 1
    --@splice bucket_crossings
    l = l - c
    s[k + 1], s[k + 2], s[k + 3] = l, now, lim
    local full
    if we > 0 then full = we - now
    else full = (lim - l) * (pd * 1e6) / lim end
    if full > ttl then ttl = full end
  end
  if ttl > spec[p + @{charge_level.max_life_us}] then ttl = spec[p + @{charge_level.max_life_us}] end
  raws[i], states[i], ttls[i] = raw, s, ttl
  p = q
  seen = seen + nb
end

if denied then
  local out = {REPLY_DENIED, now, unpack(raws)}
  out[#out + 1] = struct.pack('<' .. string.rep('d', DENIED_DOUBLES), unpack(dm, 1, DENIED_DOUBLES))
  return out
end
if nothing then return {REPLY_ALLOWED, now, unpack(raws)} end

p = @[charge] + DIMS
for i = 1, nlev do
  local s = trim_foreign(states[i], spec[p + @{charge_level.buckets}], now)
  raws[i] = write_level(KEYS[i], s, ttls[i], ARGV[@{charge_argv} + i], D, now)
  local q = p + @{charge_level}
  for _ = 1, spec[p + @{charge_level.buckets}] do
    if spec[q + @{bucket.id}] % DIM >= WINDOWS then q = q + @{bucket} else q = q + @{bucket.window_start} end
  end
  p = q
end
local indexed = crossings and alerts_fire(KEYS, crossings, alert_spec[1], ARGV[alerts_at + 1], now)
if indexed then raws[nlev + 1] = indexed end
return {REPLY_ALLOWED, now, unpack(raws)}
