#!lua
-- reserve.lua: take one request, `cost` tokens and a concurrency lease at every
-- level, all or nothing. Mirrors src/store/memory.rs; arithmetic as in
-- src/domain/bucket.rs.
--
-- KEYS[1..n]  level hashes, outermost first (only levels with a limit)
-- KEYS[n+1]   reservation record
-- KEYS[n+2]   idempotency entry (only when ARGV[6] ~= '0')
-- ARGV[1]  n          ARGV[2]  lease field '#<nonce>'   ARGV[3] cost (tokens)
-- ARGV[4]  lease ttl (us)   ARGV[5] record ttl (ms)   ARGV[6] idempotency ttl (ms, '0': none)
-- ARGV[7]  owner tag  ARGV[8] fingerprint   ARGV[9] nonce   ARGV[10] lease mask
-- ARGV[11..] per level: bucket count b, concurrency limit (-1: none),
--            then b times: field ('r<secs>' | 't<secs>'), limit, period (us)
--
-- Returns
--   {1, 0, readings...}          allowed; readings after taking the cost
--   {0, denied_mask, readings...} denied; nothing changed (bit i: check i denied)
--   {2, nonce, cost, lease_left_ms, readings...}  idempotent replay of a live reservation
--   {3}                          idempotency key already used for a different request
-- readings, per level: floor(level * 1000) per bucket; then, with a concurrency
-- limit, live leases and ms until the earliest lease lapses (0: none).
--
-- Invariants: everything is read and checked before anything is written (only
-- expired leases are reclaimed early, which changes no outcome); every key gets
-- a TTL that outlives its state; time is Redis TIME, in microseconds.

local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local nlev = tonumber(ARGV[1])
local cost = tonumber(ARGV[3])

-- Reclaims the expired leases of one level hash; returns live count and earliest expiry.
local function reclaim(key)
  local all = redis.call('HGETALL', key)
  local dead, n, e = {}, 0, nil
  for j = 1, #all, 2 do
    if string.byte(all[j]) == 35 then -- '#'
      local x = tonumber(all[j + 1])
      if x <= now then
        dead[#dead + 1] = all[j]
      else
        n = n + 1
        if not e or x < e then e = x end
      end
    end
  end
  for j = 1, #dead, 1000 do
    redis.call('HDEL', key, unpack(dead, j, math.min(j + 999, #dead)))
  end
  if e then
    redis.call('HSET', key, '@n', n, '@e', e)
  else
    redis.call('HSET', key, '@n', n)
    redis.call('HDEL', key, '@e')
  end
  return n, e
end

-- An earlier reservation under the same idempotency key?
local replay
if ARGV[6] ~= '0' then
  local nonce = redis.call('GET', KEYS[nlev + 2])
  if nonce then
    local rkey = string.sub(KEYS[nlev + 1], 1, -23) .. nonce
    local rec = redis.call('GET', rkey)
    if rec then
      local _, c, ex, _, _, fp = string.match(rec, '^(%a) (%d+) (%d+) (%d+) (%S+) (%S+) ')
      if fp ~= ARGV[8] then return {3} end
      local left = math.ceil((tonumber(ex) - now) / 1000)
      if left < 0 then left = 0 end
      replay = {2, nonce, tonumber(c), left}
    end
  end
end

-- Read and check every level.
local levels, denied, bit, pos = {}, 0, 1, 11
for i = 1, nlev do
  local nb, clim = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local lv = {nb = nb, clim = clim, first = pos + 2, lims = {}, pers = {}, costs = {}, ls = {}}
  local fields = {'@t'}
  for b = 1, nb do fields[b + 1] = ARGV[pos + 2 + (b - 1) * 3] end
  if clim >= 0 then
    fields[nb + 2] = '@n'
    fields[nb + 3] = '@e'
  end
  local v = redis.call('HMGET', KEYS[i], unpack(fields))
  local t = tonumber(v[1])
  lv.fresh = t == nil
  local el = 0
  if t then
    el = now - t
    if el < 0 then el = 0 end
  end
  for b = 1, nb do
    local p = pos + 2 + (b - 1) * 3
    local lim, per = tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2])
    local l = tonumber(v[b + 1])
    if l then
      l = l + el * lim / per
      if l > lim then l = lim end
    else
      l = lim
    end
    local c = 1
    if string.byte(ARGV[p]) == 116 then c = cost end -- 't'
    if l < c then denied = denied + bit end
    bit = bit * 2
    lv.lims[b], lv.pers[b], lv.costs[b], lv.ls[b] = lim, per, c, l
  end
  if clim >= 0 then
    local n, e = tonumber(v[nb + 2]) or 0, tonumber(v[nb + 3])
    if e and now >= e then n, e = reclaim(KEYS[i]) end
    if n >= clim then denied = denied + bit end
    bit = bit * 2
    lv.n, lv.e = n, e
  end
  levels[i] = lv
  pos = pos + 2 + nb * 3
end

local function readings(out)
  for i = 1, nlev do
    local lv = levels[i]
    for b = 1, lv.nb do out[#out + 1] = math.floor(lv.ls[b] * 1000) end
    if lv.clim >= 0 then
      out[#out + 1] = lv.n
      if lv.e then out[#out + 1] = math.ceil((lv.e - now) / 1000) else out[#out + 1] = 0 end
    end
  end
  return out
end

if replay then return readings(replay) end
if denied ~= 0 then return readings({0, denied}) end

-- Everything fits: take it.
local lease_ttl = tonumber(ARGV[4])
local exp = now + lease_ttl
for i = 1, nlev do
  local lv = levels[i]
  local args, ttl = {'@t', now}, 0
  for b = 1, lv.nb do
    local l, lim = lv.ls[b] - lv.costs[b], lv.lims[b]
    lv.ls[b] = l
    args[#args + 1] = ARGV[lv.first + (b - 1) * 3]
    args[#args + 1] = l
    local full = (lim - l) * lv.pers[b] / lim
    if full > ttl then ttl = full end
  end
  if lv.clim >= 0 then
    lv.n = lv.n + 1
    if not lv.e or exp < lv.e then lv.e = exp end
    args[#args + 1] = '@n'
    args[#args + 1] = lv.n
    args[#args + 1] = '@e'
    args[#args + 1] = lv.e
    args[#args + 1] = ARGV[2]
    args[#args + 1] = exp
    if lease_ttl > ttl then ttl = lease_ttl end
  end
  redis.call('HSET', KEYS[i], unpack(args))
  local ms = math.ceil(ttl / 1000) + 1000
  if lv.fresh then
    redis.call('PEXPIRE', KEYS[i], ms)
  else
    redis.call('PEXPIRE', KEYS[i], ms, 'GT')
  end
end

redis.call('SET', KEYS[nlev + 1],
  string.format('R %d %d %s %s %s 0', cost, exp, ARGV[10], ARGV[7], ARGV[8]),
  'PX', ARGV[5])
if ARGV[6] ~= '0' then
  redis.call('SET', KEYS[nlev + 2], ARGV[9], 'PX', ARGV[6])
end
return readings({1, 0})
