#!lua
--@prelude layout
-- alert_claim.lua: a sender claims the due alerts of one tenant's queue (the
-- Redis side of MemoryStore::claim_now; the queue's layout in alerts.lua).
-- build.rs prepends the constants and clock_us().
--
-- KEYS[1] the queue (zset: event id -> due, us)   KEYS[2] its records (hash)
-- KEYS[3] the index of queues holding alerts (zset: queue -> its earliest due);
--         absent on a Redis Cluster (another slot)
-- ARGV[1] the most to claim   ARGV[2] how long a claim holds (us)
--
-- Returns {id, record, attempts, ...}, the earliest due first: each claimed
-- alert is due again once the claim ends (a sender that dies leaves it to
-- another) and its attempts are counted. The queue's place in the index is
-- its earliest due now; an empty queue leaves it. On a cluster the reply ends
-- instead with that earliest due ('-': empty) and the time of the call, for
-- the caller to index the queue (alert_index.lua).

local now = clock_us()
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, ARGV[1])
local out = {}
for j = 1, #due do
  local id = due[j]
  redis.call('ZADD', KEYS[1], now + ARGV[2], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[2], id) or ''
  out[#out + 1] = redis.call('HINCRBY', KEYS[2], 'n:' .. id, 1)
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not KEYS[3] then
  out[#out + 1] = first[2] or '-'
  out[#out + 1] = now
elseif first[1] then redis.call('ZADD', KEYS[3], first[2], KEYS[1])
else redis.call('ZREM', KEYS[3], KEYS[1]) end
return out
