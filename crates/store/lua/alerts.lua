-- alerts.lua: the alert step of reserve.lua and settle.lua, the Redis port of
-- crates/core/src/budget/alerts.rs and the rules of crates/core/src/alert.rs. Not a
-- script of its own: build.rs puts it in their prelude.
--
-- The spec (an ARGV of little-endian doubles): the most alerts a tenant's
-- queue holds (negative on a Redis Cluster: see below), then per bucket that
-- has thresholds, in plan order: its place
-- in the plan (1: the first level's first bucket), its count k of
-- thresholds, and those k in basis points, ascending.
--
-- While an operation moves its buckets it collects, for each threshold a
-- move crosses upward (use before < t x limit <= use after; use = limit -
-- level), a crossing {level index, bucket id, limit, use after, threshold in
-- basis points, window start (0: rolling)}; a move that ends below the
-- lowest threshold is passed over with one comparison. Once its writes are
-- made, alerts_fire(K, crossings, max, rkey, now) takes each crossing in
-- turn: its marker, field 'a<id>:<bp>' of the level's hash, holds the window
-- it last fired in (or when a rolling limit last crossed); it fires unless
-- that is this window (or less than a period ago), and the marker is
-- rewritten either way. A crossing that fires is queued in the tenant's
-- queue (zset <tag>:a: event id -> due, us; hash <tag>:a:e: event id ->
-- record), and the queue is in the index <prefix>a (zset: queue -> its
-- earliest due), unless `max` wait there already: then it is counted in
-- <prefix>a:dropped. The tenant's hash tag and
-- the prefix are read off `rkey` (a record key or the record key prefix,
-- '<prefix>{T}:r:…'): these keys are reached only at a crossing, so no call
-- pays for declaring them. The record: now, bucket id, limit, use, threshold
-- (a fraction), window start as little-endian doubles, then the level's key;
-- its event id is its SHA-1. Only a crossing costs calls: two to mark it,
-- four to queue it.
--
-- On a Redis Cluster (max < 0) the index and the count are in other slots:
-- a full queue counts its drops in the records' field 'dropped', and
-- alerts_fire returns 'A<now>' (now in decimal µs) when it queued an alert,
-- for the script's reply to end with and the caller to index the queue, due
-- and seen then (alert_index.lua).

local function alerts_fire(K, crossings, max, rkey, now)
  local cut = string.find(rkey, '}:r:', 1, true)
  local tag, prefix = string.sub(rkey, 1, cut), string.match(rkey, '^([^{]*){')
  local q, e = tag .. ':a', tag .. ':a:e'
  local cluster, queued = max < 0, false
  if cluster then max = -max end
  for j = 1, #crossings do
    local c = crossings[j]
    local key, id, ws = K[c[1]], c[2], c[6]
    local field = 'a' .. string.format('%d:%d', id, c[5])
    local m = redis.call('HGET', key, field)
    local fires = true
    local mark = now
    if ws > 0 then mark = ws end
    if m then
      m = struct.unpack('<d', m)
      if ws > 0 then fires = m ~= ws else fires = now - m >= (id % DIM) * 1e6 end
    end
    redis.call('HSET', key, field, struct.pack('<d', mark))
    if fires then
      if redis.call('ZCARD', q) < max then
        local rec = struct.pack('<dddddd', now, id, c[3], c[4], c[5] / 10000, ws) .. key
        local eid = redis.sha1hex(rec)
        redis.call('HSET', e, eid, rec)
        redis.call('ZADD', q, now, eid)
        queued = true
        if not cluster then redis.call('ZADD', prefix .. 'a', 'LT', now, q) end
      elseif cluster then
        redis.call('HINCRBY', e, 'dropped', 1)
      else
        redis.call('INCR', prefix .. 'a:dropped')
      end
    end
  end
  if queued and cluster then return 'A' .. string.format('%d', now) end
  return nil
end
