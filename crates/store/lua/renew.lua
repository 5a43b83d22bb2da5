#!lua
--@prelude layout state
-- renew.lua: extend (or shorten) a live reservation's concurrency lease. The
-- Redis port of crates/core/src/budget/renew.rs, held to it by tests/store/differential/;
-- state layout as in reserve.lua. build.rs prepends the constants in capitals
-- (crates/core/src/layout.rs), clock_us() and lua/state.lua.
--
-- KEYS[1..n]  level hashes of the reservation, outermost first
-- KEYS[n+1]   reservation record
-- ARGV[1]  spec: little-endian doubles: n, new lease ttl (us), then a level bit per level
-- ARGV[2]  lease field '#<nonce>'   ARGV[3] record retention (ms)   ARGV[4] owner tag (8 bytes)
-- ARGV[5]  '<' followed by at least as many 'd' as the longest state or spec
--
-- Returns (tags REPLY_APPLIED 1, REPLY_SETTLED_BEFORE 0, REPLY_EXPIRED 2, REPLY_NOT_FOUND
-- -1, from crates/core/src/layout.rs) {1, expires_in_ms} renewed; {0} already settled; {2} the lease had
-- already lapsed (its slot is not re-taken); {-1} no such reservation.
-- Every level is read before anything is written.

local D = ARGV[@[settlement_argv.doubles]]
local spec = {struct.unpack(fmt_of(D, #ARGV[@[settlement_argv.spec]] / 8), ARGV[@[settlement_argv.spec]])}
local nlev, ttl = spec[@[renew.levels]], spec[@[renew.lease_ttl_us]]
local rkey = KEYS[nlev + @[settlement_keys.record]]
local rec = redis.call('GET', rkey)
if not rec then return {REPLY_NOT_FOUND} end
if string.sub(rec, REC_OWNER, REC_OWNER + 7) ~= ARGV[@[settlement_argv.owner]] then return {REPLY_NOT_FOUND} end
if string.sub(rec, 1, 1) ~= RESERVED then return {REPLY_SETTLED_BEFORE} end

local now = clock_us()
local _, ex = struct.unpack('<dd', rec, REC_COST)
if ex <= now then return {REPLY_EXPIRED} end

local exp = now + ttl
local keep = ttl
if keep > MAX_TTL then keep = MAX_TTL end
local mask = string.byte(rec, REC_MASK)
local writes = {}
for i = 1, nlev do
  if bit.band(mask, spec[@{renew} + i]) ~= 0 and redis.call('HEXISTS', KEYS[i], ARGV[@[settlement_argv.lease]]) == 1 then
    local raw = redis.call('HGET', KEYS[i], 's')
    local s = {0, 0, 0, STATE_V}
    if raw then
      s = {struct.unpack(fmt_of(D, #raw / 8), raw)}
      s[#s] = nil
      if s[4] ~= STATE_V then s = upgrade(s) end
    end
    -- A shorter lease may now be the earliest to lapse.
    local lower, grow = s[2] == 0 or exp < s[2], now + keep > s[3]
    if lower then s[2] = exp end
    if grow then s[3] = now + 2 * keep + TTL_SLACK end
    writes[#writes + 1] = {KEYS[i], lower or grow, struct.pack(fmt_of(D, #s), unpack(s)), grow, s[3]}
  end
end

local expbin = struct.pack('<d', exp)
for w = 1, #writes do
  local key, changed, raw, grow, x = unpack(writes[w])
  if changed then
    redis.call('HSET', key, ARGV[@[settlement_argv.lease]], expbin, 's', raw)
  else
    redis.call('HSET', key, ARGV[@[settlement_argv.lease]], expbin)
  end
  if grow then
    local ms = (x - now) / 1000
    redis.call('PEXPIRE', key, ms + (-ms) % 1)
  end
end
local ms = ttl / 1000 + (-ttl / 1000) % 1
redis.call('SET', rkey, RESERVED .. string.sub(rec, REC_COST, REC_LEASE_EXPIRY - 1) .. expbin
  .. string.sub(rec, REC_MASK),
  'PX', ms + tonumber(ARGV[@[settlement_argv.record_ttl_ms]]))
return {REPLY_APPLIED, ms}
