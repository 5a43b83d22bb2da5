#!lua
--@prelude layout
-- line.lua: one shared level's line of waiting calls, kept in Redis so that
-- every replica waits in the same line. The Redis port of
-- crates/core/src/queue.rs (start-time fair queueing: priority classes in
-- order, tenants by weight, first in first out within a tenant), held to it
-- by tests/store/differential/line.rs; the memory store's twin is
-- crates/store/src/store/memory/line.rs. The waiting itself (when to ask,
-- what a ticket first in line does) is crates/engine/src/engine/waiting.rs.
-- Not on a call's hot path: only calls that wait run it. build.rs prepends
-- the constants and clock_us().
--
-- KEYS[1] the line's state (hash): 'v<c>' class c's virtual time, 'f<c>:<tenant>'
--         the tenant's last finish in class c, 'seq' arrivals, 'x' the latest
--         deadline (us), 'a:<owner>' until when (us) a replica counts as alive
-- KEYS[2..4] the tickets of the critical, normal and batch classes (sorted
--         sets: ticket -> its finish tag)
-- ARGV    op, owner, ticket, class, tenant, weight, cost, wait_us, most,
--         channel, line (every call gives them all)
-- A ticket is '<arrival, 12 digits>|<owner>|<deadline, us>|<start tag>|<tenant>';
-- ties on the finish go to the earlier arrival. Tags are written '%.17g' (they
-- read back exactly: the arithmetic is the Rust queue's, in the same doubles).
--
-- Every op first drops the tickets at the head of the line whose deadline
-- passed or whose owner has not beaten for ALIVE_US (a replica that died),
-- and marks the caller's owner alive. Then:
--   1 join   queues a ticket of tenant (weight, cost) in class, its deadline
--            now + wait_us, unless `most` wait already:
--            {1, ticket, 1 when first in line, waiting} or {0, waiting}
--   2 head   {1 when ticket is first in line, 1 when it is still in line}
--   3 leave, granted   / 4 leave, withdrawn: takes ticket out (granted: the
--            class's virtual time moves to its start; withdrawn: its tenant's
--            last finish goes back to its start when it was the last), then as 5
--   5 wake   {the ticket first in line ('' for none), waiting}
-- 3, 4 and 5 PUBLISH 'w|<ticket>' on channel when the first ticket's owner is
-- another replica (it wakes it), and 1, 3, 4 and 5 PUBLISH
-- 'n|<waiting>|<line>' (replicas learn which lines have waiting calls: a
-- Commit or Refund there wakes the line). An empty line's state is deleted
-- (its fair clocks start again at 0); the keys expire a second after the
-- latest deadline.

local now = clock_us()
local ALIVE_US = 5000000
local op, owner = tonumber(ARGV[@[line_argv.op]]), ARGV[@[line_argv.owner]]
local state = KEYS[@[line_keys.state]]
local zs = {KEYS[@[line_keys.critical]], KEYS[@[line_keys.normal]], KEYS[@[line_keys.batch]]}
local channel = ARGV[@[line_argv.channel]]

local function fmt(x) return string.format('%.17g', x) end

-- A ticket's owner, deadline, start tag and tenant.
local function parse(t)
  local o, d, st, tenant = string.match(t, '^%d+|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return o, tonumber(d), tonumber(st), tenant
end

local function waiting()
  return redis.call('ZCARD', zs[1]) + redis.call('ZCARD', zs[2]) + redis.call('ZCARD', zs[3])
end

-- FairQueue::forget_idle: an idle class's clock moves to its tenants' last
-- finishes and forgets them; else the tenant is forgotten once caught up.
local function forget_idle(c, tenant)
  local v = tonumber(redis.call('HGET', state, 'v' .. c)) or 0
  if redis.call('ZCARD', zs[c + 1]) == 0 then
    local all, prefix, gone = redis.call('HGETALL', state), 'f' .. c .. ':', {}
    for i = 1, #all, 2 do
      if string.sub(all[i], 1, #prefix) == prefix then
        local f = tonumber(all[i + 1])
        if f > v then v = f end
        gone[#gone + 1] = all[i]
      end
    end
    if #gone > 0 then redis.call('HDEL', state, unpack(gone)) end
    redis.call('HSET', state, 'v' .. c, fmt(v))
    return
  end
  local key = 'f' .. c .. ':' .. tenant
  local f = tonumber(redis.call('HGET', state, key))
  if f and f <= v then redis.call('HDEL', state, key) end
end

-- FairQueue::withdraw.
local function withdraw(c, t)
  local _, _, st, tenant = parse(t)
  local fin = tonumber(redis.call('ZSCORE', zs[c + 1], t))
  redis.call('ZREM', zs[c + 1], t)
  local key = 'f' .. c .. ':' .. tenant
  if tonumber(redis.call('HGET', state, key)) == fin then redis.call('HSET', state, key, fmt(st)) end
  forget_idle(c, tenant)
end

-- FairQueue::serve.
local function serve(c, t)
  local _, _, st, tenant = parse(t)
  redis.call('ZREM', zs[c + 1], t)
  local v = tonumber(redis.call('HGET', state, 'v' .. c)) or 0
  if st > v then redis.call('HSET', state, 'v' .. c, fmt(st)) end
  forget_idle(c, tenant)
end

-- The ticket first in line, past the stale ones (dropped as withdrawn).
local function head()
  for c = 0, 2 do
    while true do
      local h = redis.call('ZRANGE', zs[c + 1], 0, 0)[1]
      if not h then break end
      local o, d = parse(h)
      local alive = tonumber(redis.call('HGET', state, 'a:' .. o))
      if d > now and not (alive and alive < now) then return h end
      withdraw(c, h)
    end
  end
  return nil
end

redis.call('HSET', state, 'a:' .. owner, fmt(now + ALIVE_US))
local first = head()
local c, t = tonumber(ARGV[@[line_argv.class]]), ARGV[@[line_argv.ticket]]

if op == 1 then
  local n = waiting()
  if n >= tonumber(ARGV[@[line_argv.most]]) then
    if n == 0 then redis.call('DEL', state) end
    return {0, n}
  end
  local tenant = ARGV[@[line_argv.tenant]]
  local v = tonumber(redis.call('HGET', state, 'v' .. c)) or 0
  local key = 'f' .. c .. ':' .. tenant
  local start = tonumber(redis.call('HGET', state, key)) or v
  if start < v then start = v end
  local cost = tonumber(ARGV[@[line_argv.cost]])
  if cost < 0 then cost = 0 end
  local fin = start + cost / tonumber(ARGV[@[line_argv.weight]])
  redis.call('HSET', state, key, fmt(fin))
  local seq = redis.call('HINCRBY', state, 'seq', 1)
  local deadline = now + tonumber(ARGV[@[line_argv.wait_us]])
  local ticket = string.format('%012d|%s|%.0f|%s|%s', seq, owner, deadline, fmt(start), tenant)
  redis.call('ZADD', zs[c + 1], fmt(fin), ticket)
  local latest = tonumber(redis.call('HGET', state, 'x')) or 0
  if deadline > latest then
    redis.call('HSET', state, 'x', fmt(deadline))
    local keep = math.ceil((deadline - now) / 1000) + 1000
    redis.call('PEXPIRE', state, keep)
    for i = 1, 3 do redis.call('PEXPIRE', zs[i], keep) end
  end
  first = head()
  redis.call('PUBLISH', channel, 'n|' .. (n + 1) .. '|' .. ARGV[@[line_argv.line]])
  return {1, ticket, first == ticket and 1 or 0, n + 1}
end

if op == 2 then
  local here = redis.call('ZSCORE', zs[c + 1], t) and 1 or 0
  if not first then redis.call('DEL', state) end
  return {first == t and 1 or 0, here}
end

if (op == 3 or op == 4) and redis.call('ZSCORE', zs[c + 1], t) then
  if op == 3 then serve(c, t) else withdraw(c, t) end
  first = head()
end
local n = waiting()
if first and parse(first) ~= owner then redis.call('PUBLISH', channel, 'w|' .. first) end
redis.call('PUBLISH', channel, 'n|' .. n .. '|' .. ARGV[@[line_argv.line]])
if n == 0 then redis.call('DEL', state) end
return {first or '', n}
