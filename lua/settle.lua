#!lua
-- settle.lua: Commit (the real usage) or Refund (nothing used) one reservation.
-- Mirrors src/store/memory.rs; arithmetic as in src/domain/bucket.rs.
--
-- KEYS[1..n]  level hashes of the reservation, outermost first (every level, limited or not)
-- KEYS[n+1]   reservation record
-- ARGV[1] n   ARGV[2] mode: 'C' commit | 'F' refund   ARGV[3] actual tokens (commit)
-- ARGV[4] record retention (ms)   ARGV[5] owner tag   ARGV[6] lease field '#<nonce>'
-- ARGV[7..] per level: level bit, bucket count b, then b times: field, limit, period (us)
--
-- Returns
--   {1, amount}          applied: commit → actual - reserved; refund → tokens returned
--   {0, state, amount}   already settled ('C' committed | 'F' refunded) with its amount
--   {-1}                 no such reservation (never made, long gone, or id tampered with)
--
-- Commit charges an overage even into debt and returns a surplus without
-- overfilling; it touches token buckets only. Refund returns the tokens and the
-- request. Both free the lease, expired or not. A settled record is kept for
-- ARGV[4] ms so repeats answer ALREADY_SETTLED and change nothing.

local nlev = tonumber(ARGV[1])
local rkey = KEYS[nlev + 1]
local rec = redis.call('GET', rkey)
if not rec then return {-1} end
local st, cost, ex, mask, owner, fp, amt =
  string.match(rec, '^(%a) (%d+) (%d+) (%d+) (%S+) (%S+) (%-?%d+)$')
if owner ~= ARGV[5] then return {-1} end
if st ~= 'R' then return {0, st, tonumber(amt)} end

local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local refund = ARGV[2] == 'F'
cost = tonumber(cost)
mask = tonumber(mask)
local dtok, dreq, amount
if refund then
  dtok, dreq, amount = -cost, -1, cost
else
  dtok, dreq = tonumber(ARGV[3]) - cost, 0
  amount = dtok
end

local pos = 7
for i = 1, nlev do
  local lbit, nb = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local fields, specs = {'@t'}, {}
  for b = 1, nb do
    local p = pos + 2 + (b - 1) * 3
    local d = dreq
    if string.byte(ARGV[p]) == 116 then d = dtok end -- 't'
    if d ~= 0 then
      fields[#fields + 1] = ARGV[p]
      specs[#specs + 1] = {ARGV[p], tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), d}
    end
  end
  if #specs > 0 then
    local v = redis.call('HMGET', KEYS[i], unpack(fields))
    local t = tonumber(v[1])
    local el = 0
    if t then
      el = now - t
      if el < 0 then el = 0 end
    end
    local args, ttl = {'@t', now}, 0
    for s = 1, #specs do
      local f, lim, per, d = specs[s][1], specs[s][2], specs[s][3], specs[s][4]
      local l = tonumber(v[s + 1])
      if l then
        l = l + el * lim / per
        if l > lim then l = lim end
      else
        l = lim
      end
      l = l - d
      if d < 0 and l > lim then l = lim end
      args[#args + 1] = f
      args[#args + 1] = l
      local full = (lim - l) * per / lim
      if full > ttl then ttl = full end
    end
    redis.call('HSET', KEYS[i], unpack(args))
    local ms = math.ceil(ttl / 1000) + 1000
    if t then
      redis.call('PEXPIRE', KEYS[i], ms, 'GT')
    else
      redis.call('PEXPIRE', KEYS[i], ms)
    end
  end
  if bit.band(mask, lbit) ~= 0 and redis.call('HDEL', KEYS[i], ARGV[6]) == 1 then
    redis.call('HINCRBY', KEYS[i], '@n', -1)
  end
  pos = pos + 2 + nb * 3
end

local state = 'C'
if refund then state = 'F' end
redis.call('SET', rkey,
  string.format('%s %d %s %s %s %s %d', state, cost, ex, mask, owner, fp, amount),
  'PX', ARGV[4])
return {1, amount}
