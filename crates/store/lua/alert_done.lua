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
if not redis.call('ZSCORE', KEYS[@[alert_done_keys.queue]], ARGV[@[alert_done_argv.id]]) then return {0} end
if ARGV[@[alert_done_argv.mode]] == '2' then
  redis.call('ZADD', KEYS[@[alert_done_keys.queue]], now + ARGV[@[alert_done_argv.retry_us]], ARGV[@[alert_done_argv.id]])
else
  redis.call('ZREM', KEYS[@[alert_done_keys.queue]], ARGV[@[alert_done_argv.id]])
  redis.call('HDEL', KEYS[@[alert_done_keys.records]], ARGV[@[alert_done_argv.id]], 'n:' .. ARGV[@[alert_done_argv.id]])
  if ARGV[@[alert_done_argv.mode]] == '3' and KEYS[@[alert_done_keys.dropped]] then redis.call('INCR', KEYS[@[alert_done_keys.dropped]])
  elseif ARGV[@[alert_done_argv.mode]] == '3' then redis.call('HINCRBY', KEYS[@[alert_done_keys.records]], 'dropped', 1) end
end
local first = redis.call('ZRANGE', KEYS[@[alert_done_keys.queue]], 0, 0, 'WITHSCORES')
if not KEYS[@[alert_done_keys.index]] then return {1, first[2] or '-', now} end
if first[1] then redis.call('ZADD', KEYS[@[alert_done_keys.index]], first[2], KEYS[@[alert_done_keys.queue]])
else redis.call('ZREM', KEYS[@[alert_done_keys.index]], KEYS[@[alert_done_keys.queue]]) end
return {1}
