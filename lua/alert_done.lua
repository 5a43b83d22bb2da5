#!lua
--@prelude layout
-- alert_done.lua: what became of a claimed alert (the Redis side of
-- MemoryStore::finish_now; the queue's layout in alerts.lua). build.rs
-- prepends the constants and clock_us().
--
-- KEYS[1] the queue   KEYS[2] its records   KEYS[3] the index of queues
-- holding alerts (zset: queue -> its earliest due)   KEYS[4] the count of
-- alerts dropped; KEYS[3] and KEYS[4] absent on a Redis Cluster (other slots)
-- ARGV[1] the event id   ARGV[2] 1 sent, 2 to retry, 3 dropped
-- ARGV[3] (to retry) the wait before it is due again (us)
--
-- Returns {1}, or {0} when the alert is no longer queued (another sender
-- finished it). Sent and dropped leave the queue (dropped is counted); the
-- queue's place in the index is its earliest due now (an empty one leaves it).
-- On a cluster the reply is {1, earliest due ('-': empty), the time of the
-- call}, for the caller to index the queue (alert_index.lua), and a drop is
-- counted in the records' field 'dropped'.

local now = clock_us()
if not redis.call('ZSCORE', KEYS[1], ARGV[1]) then return {0} end
if ARGV[2] == '2' then
  redis.call('ZADD', KEYS[1], now + ARGV[3], ARGV[1])
else
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1], 'n:' .. ARGV[1])
  if ARGV[2] == '3' and KEYS[4] then redis.call('INCR', KEYS[4])
  elseif ARGV[2] == '3' then redis.call('HINCRBY', KEYS[2], 'dropped', 1) end
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if not KEYS[3] then return {1, first[2] or '-', now} end
if first[1] then redis.call('ZADD', KEYS[3], first[2], KEYS[1])
else redis.call('ZREM', KEYS[3], KEYS[1]) end
return {1}
