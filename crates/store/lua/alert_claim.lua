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
local due = redis.call('ZRANGEBYSCORE', KEYS[@[alert_claim_keys.queue]], '-inf', now, 'LIMIT', 0, ARGV[@[alert_claim_argv.most]])
local out = {}
for j = 1, #due do
  local id = due[j]
  redis.call('ZADD', KEYS[@[alert_claim_keys.queue]], now + ARGV[@[alert_claim_argv.claim_us]], id)
  out[#out + 1] = id
  out[#out + 1] = redis.call('HGET', KEYS[@[alert_claim_keys.records]], id) or ''
  out[#out + 1] = redis.call('HINCRBY', KEYS[@[alert_claim_keys.records]], 'n:' .. id, 1)
end
local first = redis.call('ZRANGE', KEYS[@[alert_claim_keys.queue]], 0, 0, 'WITHSCORES')
if not KEYS[@[alert_claim_keys.index]] then
  out[#out + 1] = first[2] or '-'
  out[#out + 1] = now
elseif first[1] then redis.call('ZADD', KEYS[@[alert_claim_keys.index]], first[2], KEYS[@[alert_claim_keys.queue]])
else redis.call('ZREM', KEYS[@[alert_claim_keys.index]], KEYS[@[alert_claim_keys.queue]]) end
return out
