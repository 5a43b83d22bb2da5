#!lua
--@prelude layout
-- line.lua: one shared level's line of waiting calls, kept in Redis so that
-- every replica waits in the same line. The Redis port of
-- crates/core/src/queue.rs (start-time fair queueing over one queue per
-- tenant: priority classes in order, tenants by weight, first in first out
-- within a tenant; a tenant is charged for its grants only), held to it by
-- tests/store/differential/line.rs; the memory store's twin is
-- crates/store/src/store/memory/line.rs. The waiting itself (when to ask,
-- what a ticket first in line does) is crates/engine/src/engine/waiting.rs.
-- Not on a call's hot path: only calls that wait run it. build.rs prepends
-- the constants and clock_us().
--
-- KEYS[1] the line's state (hash): 'v<c>' class c's virtual time,
--         'f<c>:<tenant>' the finish of the tenant's last grant in class c,
--         's<c>:<tenant>' the start tag of its first ticket there (present
--         while it has tickets), 'seq' arrivals, 'x' the latest deadline
--         (us), 'a:<owner>' until when (us) a replica counts as alive
-- KEYS[2..4] the tenants' first tickets in the critical, normal and batch
--         classes (sorted sets: ticket -> its start tag)
-- KEYS[5] every other ticket (sorted set, all scores 0, by member:
--         '<c>|<tenant's length>|<tenant>|<ticket>', so a tenant's next is
--         the first member with its prefix)
-- ARGV    op, owner, ticket, class, tenant, weight, cost, wait_us, most,
--         channel, line (every call gives them all)
-- A ticket is '<arrival, 12 digits>|<owner>|<deadline, us>|<cost>|<weight>|<tenant>';
-- ties on the start go to the earlier arrival. Tags are written '%.17g' (they
-- read back exactly: the arithmetic is the Rust queue's, in the same doubles).
--
-- Every op first drops the tickets at the head of the line whose deadline
-- passed or whose owner has not beaten for ALIVE_US (a replica that died),
-- and marks the caller's owner alive. Then:
--   1 join   queues a ticket of tenant (weight, cost) in class, its deadline
--            now + wait_us, unless `most` wait already; stamped when it is
--            its tenant's first: {1, ticket, 1 when first in line, waiting}
--            or {0, waiting}
--   2 head   {1 when ticket is first in line, 1 when it is still in line}
--   3 leave, granted   / 4 leave, withdrawn: takes ticket out (granted, and
--            its tenant's first: the class's virtual time moves to its start
--            and the tenant's last finish to its finish), stamps the
--            tenant's next ticket, then as 5
--   5 wake   {the ticket first in line ('' for none), waiting}
-- 3, 4 and 5 PUBLISH 'w|<ticket>' on channel when the first ticket's owner is
-- another replica (it wakes it), and 1, 3, 4 and 5 PUBLISH
-- 'n|<waiting>|<line>' (replicas learn which lines have waiting calls: a
-- Commit or Refund there wakes the line). An emptied line keeps its fair
-- clocks (callers whose waits ran out ask again) until a second after its
-- latest deadline, when its keys expire; a line that never had a ticket
-- leaves no key.

local now = clock_us()
local ALIVE_US = 5000000
local KEEP_US = 1000000
local op, owner = tonumber(ARGV[@[line_argv.op]]), ARGV[@[line_argv.owner]]
local state = KEYS[@[line_keys.state]]
local zs = {KEYS[@[line_keys.critical]], KEYS[@[line_keys.normal]], KEYS[@[line_keys.batch]]}
local pending = KEYS[@[line_keys.pending]]
local channel = ARGV[@[line_argv.channel]]

local function fmt(x) return string.format('%.17g', x) end

-- A ticket's owner, deadline, cost, weight and tenant.
local function parse(t)
  local o, d, cost, w, tenant = string.match(t, '^%d+|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  return o, tonumber(d), tonumber(cost), tonumber(w), tenant
end

-- The prefix of a tenant's tickets in `pending`.
local function prefix(c, tenant) return c .. '|' .. #tenant .. '|' .. tenant .. '|' end

local function waiting()
  return redis.call('ZCARD', zs[1]) + redis.call('ZCARD', zs[2]) + redis.call('ZCARD', zs[3])
    + redis.call('ZCARD', pending)
end

local function vt(c) return tonumber(redis.call('HGET', state, 'v' .. c)) or 0 end

-- FairQueue::stamp_first: the tenant's first ticket starts at the later of
-- the virtual time and the tenant's last finish.
local function stamp(c, t)
  local _, _, cost, w, tenant = parse(t)
  local v = vt(c)
  local start = tonumber(redis.call('HGET', state, 'f' .. c .. ':' .. tenant)) or v
  if start < v then start = v end
  redis.call('HSET', state, 's' .. c .. ':' .. tenant, fmt(start))
  redis.call('ZADD', zs[c + 1], fmt(start), t)
end

-- FairQueue::after_leaving: the tenant's next ticket stamped, or a tenant
-- without tickets forgotten once the virtual time has caught up with it.
local function after_leaving(c, tenant, was_first)
  if was_first then
    redis.call('HDEL', state, 's' .. c .. ':' .. tenant)
    local p = prefix(c, tenant)
    local m = redis.call('ZRANGEBYLEX', pending, '[' .. p, '(' .. p .. '\255', 'LIMIT', 0, 1)[1]
    if m then
      redis.call('ZREM', pending, m)
      stamp(c, string.sub(m, #p + 1))
      return
    end
  elseif redis.call('HEXISTS', state, 's' .. c .. ':' .. tenant) == 1 then
    return
  end
  local key = 'f' .. c .. ':' .. tenant
  local f = tonumber(redis.call('HGET', state, key))
  if f and f <= vt(c) then redis.call('HDEL', state, key) end
end

-- FairQueue::take, then serve's charge when granted: false when t is not
-- in line.
local function take(c, t, granted)
  local _, _, cost, w, tenant = parse(t)
  local st = tonumber(redis.call('ZSCORE', zs[c + 1], t))
  if not st then
    if redis.call('ZREM', pending, prefix(c, tenant) .. t) == 0 then return false end
    after_leaving(c, tenant, false)
    return true
  end
  redis.call('ZREM', zs[c + 1], t)
  if granted then
    if st > vt(c) then redis.call('HSET', state, 'v' .. c, fmt(st)) end
    redis.call('HSET', state, 'f' .. c .. ':' .. tenant, fmt(st + cost / w))
  end
  after_leaving(c, tenant, true)
  return true
end

-- The ticket first in line, past the stale ones (dropped as withdrawn).
local function head()
  for c = 0, 2 do
    while true do
      local h = redis.call('ZRANGE', zs[c + 1], 0, 0)[1]
      if not h then break end
      local o, d = parse(h)
      if not d then
        -- Not a ticket of this layout (an earlier release's): gone.
        redis.call('ZREM', zs[c + 1], h)
      else
        local alive = tonumber(redis.call('HGET', state, 'a:' .. o))
        if d > now and not (alive and alive < now) then return h end
        take(c, h, false)
      end
    end
  end
  return nil
end

-- A line past its latest deadline by KEEP_US is what its keys expiring
-- then leave: nothing (the same rule at script time as at Redis's).
local latest = tonumber(redis.call('HGET', state, 'x'))
if latest and now >= latest + KEEP_US then
  redis.call('DEL', state, zs[1], zs[2], zs[3], pending)
  latest = nil
end
-- An empty line keeps its clocks until then (FairQueue::after_leaving).
local function tidy(n)
  if n == 0 and not latest then redis.call('DEL', state) end
end

redis.call('HSET', state, 'a:' .. owner, fmt(now + ALIVE_US))
local first = head()
local c, t = tonumber(ARGV[@[line_argv.class]]), ARGV[@[line_argv.ticket]]

if op == 1 then
  local n = waiting()
  if n >= tonumber(ARGV[@[line_argv.most]]) then
    tidy(n)
    return {0, n}
  end
  local tenant = ARGV[@[line_argv.tenant]]
  local seq = redis.call('HINCRBY', state, 'seq', 1)
  local deadline = now + tonumber(ARGV[@[line_argv.wait_us]])
  local ticket = string.format('%012d|%s|%.0f|%s|%s|%s', seq, owner, deadline,
    ARGV[@[line_argv.cost]], ARGV[@[line_argv.weight]], tenant)
  if redis.call('HEXISTS', state, 's' .. c .. ':' .. tenant) == 1 then
    redis.call('ZADD', pending, 0, prefix(c, tenant) .. ticket)
  else
    stamp(c, ticket)
  end
  if deadline > (latest or 0) then
    redis.call('HSET', state, 'x', fmt(deadline))
    local keep = math.ceil((deadline - now) / 1000) + 1000
    redis.call('PEXPIRE', state, keep)
    for i = 1, 3 do redis.call('PEXPIRE', zs[i], keep) end
    redis.call('PEXPIRE', pending, keep)
  end
  first = head()
  redis.call('PUBLISH', channel, 'n|' .. (n + 1) .. '|' .. ARGV[@[line_argv.line]])
  return {1, ticket, first == ticket and 1 or 0, n + 1}
end

if op == 2 then
  local _, _, _, _, tenant = parse(t)
  local here = (redis.call('ZSCORE', zs[c + 1], t)
    or redis.call('ZSCORE', pending, prefix(c, tenant) .. t)) and 1 or 0
  -- No first ticket: no ticket at all (every tenant's first is stamped).
  if not first then tidy(0) end
  return {first == t and 1 or 0, here}
end

if (op == 3 or op == 4) and take(c, t, op == 3) then
  first = head()
end
local n = waiting()
if first and parse(first) ~= owner then redis.call('PUBLISH', channel, 'w|' .. first) end
redis.call('PUBLISH', channel, 'n|' .. n .. '|' .. ARGV[@[line_argv.line]])
tidy(n)
return {first or '', n}
