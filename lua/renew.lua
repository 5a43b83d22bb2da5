#!lua
-- renew.lua: extend a live reservation's concurrency lease. Mirrors
-- src/store/memory.rs.
--
-- KEYS[1..n]  level hashes of the reservation, outermost first
-- KEYS[n+1]   reservation record
-- ARGV[1] n   ARGV[2] new lease ttl (us)   ARGV[3] record retention (ms)
-- ARGV[4] owner tag   ARGV[5] lease field '#<nonce>'   ARGV[6..] level bit per level
--
-- Returns {1, expires_in_ms} renewed; {0} already settled; {2} the lease had
-- already lapsed (its slot is not re-taken); {-1} no such reservation.

local nlev = tonumber(ARGV[1])
local rkey = KEYS[nlev + 1]
local rec = redis.call('GET', rkey)
if not rec then return {-1} end
local st, cost, ex, mask, rest = string.match(rec, '^(%a) (%d+) (%d+) (%d+) (.*)$')
if string.match(rest, '^(%S+)') ~= ARGV[4] then return {-1} end
if st ~= 'R' then return {0} end

local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
if tonumber(ex) <= now then return {2} end

local ttl = tonumber(ARGV[2])
local exp = now + ttl
local ms = math.ceil(ttl / 1000)
mask = tonumber(mask)
for i = 1, nlev do
  if bit.band(mask, tonumber(ARGV[5 + i])) ~= 0
      and redis.call('HEXISTS', KEYS[i], ARGV[5]) == 1 then
    redis.call('HSET', KEYS[i], ARGV[5], exp)
    redis.call('PEXPIRE', KEYS[i], ms + 1000, 'GT')
  end
end
redis.call('SET', rkey, string.format('R %s %d %s %s', cost, exp, mask, rest),
  'PX', ms + tonumber(ARGV[3]))
return {1, ms}
