#!lua flags=no-writes
-- status.lua: read the budgets of some levels without changing anything.
-- Mirrors src/store/memory.rs.
--
-- KEYS[1..n]  level hashes, outermost first (only levels with a limit)
-- ARGV[1] n   ARGV[2..] per level: bucket count b, concurrency limit (-1: none),
--             then b times: field, limit, period (us)
--
-- Returns readings, per level: floor(level * 1000) per bucket; then, with a
-- concurrency limit, live leases and ms until the earliest lease lapses (0: none).

local clock = redis.call('TIME')
local now = clock[1] * 1000000 + clock[2]
local nlev = tonumber(ARGV[1])
local out, pos = {}, 2
for i = 1, nlev do
  local nb, clim = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1])
  local fields = {'@t'}
  for b = 1, nb do fields[b + 1] = ARGV[pos + 2 + (b - 1) * 3] end
  if clim >= 0 then
    fields[nb + 2] = '@n'
    fields[nb + 3] = '@e'
  end
  local v = redis.call('HMGET', KEYS[i], unpack(fields))
  local t = tonumber(v[1])
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
    out[#out + 1] = math.floor(l * 1000)
  end
  if clim >= 0 then
    local n, e = tonumber(v[nb + 2]) or 0, tonumber(v[nb + 3])
    if e and now >= e then
      -- Count live leases without reclaiming the expired ones.
      local all = redis.call('HGETALL', KEYS[i])
      n, e = 0, nil
      for j = 1, #all, 2 do
        if string.byte(all[j]) == 35 then
          local x = tonumber(all[j + 1])
          if x > now then
            n = n + 1
            if not e or x < e then e = x end
          end
        end
      end
    end
    out[#out + 1] = n
    if e then out[#out + 1] = math.ceil((e - now) / 1000) else out[#out + 1] = 0 end
  end
  pos = pos + 2 + nb * 3
end
return out
