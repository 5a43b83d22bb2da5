-- alerts.lua: the alert step of reserve.lua and settle.lua, the Redis port of
-- src/domain/budget/alerts.rs and the rules of src/domain/alert.rs. Not a
-- script of its own: build.rs puts it in their prelude.
--
-- While an operation moves its buckets it collects, for each threshold a
-- move crosses upward (use before < t x limit <= use after; use = limit -
-- level), a crossing {level index, bucket id, limit, use after, threshold in
-- basis points, window start (0: rolling)}. Once its writes are made,
-- alerts_fire(K, crossings, max, now) takes each crossing in turn: its marker,
-- field 'a<id>:<bp>' of the level's hash, holds the window it last fired in
-- (or when a rolling limit last crossed); it fires unless that is this
-- window (or less than a period ago), and the marker is rewritten either way.
-- A crossing that fires is queued in the tenant's queue, the last four of K
-- being the queue (zset: event id -> due, us), its records (hash: event id ->
-- record), the set of queues holding alerts and the count of alerts dropped,
-- unless `max` wait there already: then it is counted dropped. The record: now, bucket id, limit, use,
-- threshold (a fraction), window start as little-endian doubles, then the
-- level's key; its event id is its SHA-1. Only a crossing costs calls: two
-- to mark it, four to queue it.

local function alerts_fire(K, crossings, max, now)
  local nk = #K
  local q, e, idx, dropped = K[nk - 3], K[nk - 2], K[nk - 1], K[nk]
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
        redis.call('SADD', idx, q)
      else
        redis.call('INCR', dropped)
      end
    end
  end
end
