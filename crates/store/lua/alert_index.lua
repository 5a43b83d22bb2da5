#!lua
--@prelude layout
-- alert_index.lua: on a Redis Cluster, where a tenant's alert queue and the
-- index of queues holding alerts are in different slots, the index is kept by
-- the callers of the tenant's scripts (a crossing in reserve.lua or
-- settle.lua, alert_claim.lua, alert_done.lua), each telling it what it saw
-- and when (the tenant's node's clock). build.rs prepends the constants and
-- clock_us().
--
-- KEYS[1] the index (zset: queue -> its earliest due, us)
-- KEYS[2] when each indexed queue was last seen (hash: queue -> us)
-- ARGV[1] the queue   ARGV[2] when it was seen   ARGV[3] its earliest due then
--         ('-': empty)
--
-- News older than what the index last heard of the queue changes nothing (a
-- claim that saw the queue empty must not drop an alert a crossing queued
-- after it); otherwise the queue is indexed at its earliest due, or leaves
-- the index when empty. Returns {1} when applied, {0} when older.

local last = redis.call('HGET', KEYS[@[alert_index_keys.seen]], ARGV[@[alert_index_argv.queue]])
if last and tonumber(last) > tonumber(ARGV[@[alert_index_argv.seen]]) then return {0} end
if ARGV[@[alert_index_argv.due]] == '-' then
  redis.call('ZREM', KEYS[@[alert_index_keys.index]], ARGV[@[alert_index_argv.queue]])
  redis.call('HDEL', KEYS[@[alert_index_keys.seen]], ARGV[@[alert_index_argv.queue]])
else
  redis.call('ZADD', KEYS[@[alert_index_keys.index]], ARGV[@[alert_index_argv.due]], ARGV[@[alert_index_argv.queue]])
  redis.call('HSET', KEYS[@[alert_index_keys.seen]], ARGV[@[alert_index_argv.queue]], ARGV[@[alert_index_argv.seen]])
end
return {1}
