#!lua
-- renew.lua: extend a live reservation's concurrency lease. Mirrors
-- MemoryStore::renew_now (src/store/memory.rs); state layout as in reserve.lua.
--
-- KEYS[1..n]  level hashes of the reservation, outermost first
-- KEYS[n+1]   reservation record
-- ARGV[1]  spec: little-endian doubles: n, new lease ttl (us), then a level bit per level
-- ARGV[2]  lease field '#<nonce>'   ARGV[3] record retention (ms)   ARGV[4] owner tag (8 bytes)
-- ARGV[5]  '<' followed by at least as many 'd' as the longest state or spec
--
-- Returns {1, expires_in_ms} renewed; {0} already settled; {2} the lease had
-- already lapsed (its slot is not re-taken); {-1} no such reservation.

local D = ARGV[5]
local spec = {struct.unpack(string.sub(D, 1, #ARGV[1] / 8 + 1), ARGV[1])}
local nlev, ttl = spec[1], spec[2]
local rkey = KEYS[nlev + 1]
local rec = redis.call('GET', rkey)
if not rec then return {-1} end
if string.sub(rec, 19, 26) ~= ARGV[4] then return {-1} end
if string.sub(rec, 1, 1) ~= 'R' then return {0} end

local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local _, ex = struct.unpack('<dd', rec, 2)
if ex <= now then return {2} end

local exp = now + ttl
local mask = string.byte(rec, 18)
for i = 1, nlev do
  if bit.band(mask, spec[2 + i]) ~= 0 and redis.call('HEXISTS', KEYS[i], ARGV[2]) == 1 then
    redis.call('HSET', KEYS[i], ARGV[2], struct.pack('<d', exp))
    local raw = redis.call('HGET', KEYS[i], 's')
    if raw then
      local s = {struct.unpack(string.sub(D, 1, #raw / 8 + 1), raw)}
      s[#s] = nil
      if exp > s[3] then
        s[3] = now + 2 * ttl + 1000000
        redis.call('HSET', KEYS[i], 's', struct.pack(string.sub(D, 1, #s + 1), unpack(s)))
        local ms = (s[3] - now) / 1000
        redis.call('PEXPIRE', KEYS[i], ms + (-ms) % 1)
      end
    end
  end
end
local ms = ttl / 1000 + (-ttl / 1000) % 1
redis.call('SET', rkey, 'R' .. string.sub(rec, 2, 9) .. struct.pack('<d', exp) .. string.sub(rec, 18),
  'PX', ms + tonumber(ARGV[3]))
return {1, ms}
