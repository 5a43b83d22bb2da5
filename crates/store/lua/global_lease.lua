#!lua
--@prelude layout state level
-- global_lease.lua: one replica's sync with the global level on a Redis Cluster:
-- give back or owe budget, lease chunks of every global bucket and concurrency
-- slots, post and read the slot messages. The Rust side is
-- crates/store/src/store/cluster/share/ (what to ask, and what the answer means);
-- state layout as in reserve.lua. build.rs prepends the constants in capitals
-- (crates/core/src/layout.rs), clock_us(), lua/state.lua and lua/level.lua,
-- and splices lua/splice/window_now.lua and bucket_level.lua.
--
-- KEYS[1..n]  the global entries' hashes (all tagged {g}: one slot)
-- KEYS[n+1]   (calls.rs lease_keys) the slot messages hash: field = a lease field ('#<nonce>'), value =
--             doubles (the lease's new expiry, 0: settled; when posted), us
-- ARGV[1]  spec: little-endian doubles: n, then per entry: bucket count b,
--          concurrency limit (-1: none), slots to lease, slots to give back, until
--          when (us) this replica's slots are counted, then b times: id, limit (a
--          calendar window's start, end and next end follow, as in reserve.lua),
--          want, give (given back when positive, owed as debt when negative)
-- ARGV[2]  this replica's slots field ('c' followed by its id)
-- ARGV[3]  '<' followed by at least as many 'd' as the longest state or spec
-- ARGV[4]  how long (ms) a message is kept for its replica to read
-- ARGV[5]  '1': read the messages   ARGV[6] p: messages to post   ARGV[7] q: to delete
-- ARGV[8..7+2p]      p pairs: lease field, expiry (a packed double)
-- ARGV[8+2p..7+2p+2q] q pairs: a message this replica matched earlier, to delete:
--          field, the value it read (a message posted again since is kept)
--
-- A bucket gives back first (capped at its limit, as a refund), then leases
-- what it has up to want (never below 0: the last units are leased too). A
-- slots entry counts every replica's live field (dropping lapsed ones), takes
-- the slots given back off this replica's, and leases up to the limit.
-- Returns {now, grants, state_1..state_n, [field, value]...}: grants = doubles,
-- per entry: what each bucket leased, then the slots counted for this replica
-- and for all; then, with ARGV[5] = '1', every message (lapsed ones dropped).

local now = clock_us()
local D = ARGV[@[lease_argv.doubles]]
local spec = {struct.unpack(fmt_of(D, #ARGV[@[lease_argv.spec]] / 8), ARGV[@[lease_argv.spec]])}
local n = spec[@[lease.entries]]
local mine_field = ARGV[@[lease_argv.replica]]
local grants, raws = {}, {}
local p = @[lease]
for i = 1, n do
  local nb, clim = spec[p + @{lease_entry.buckets}], spec[p + @{lease_entry.concurrency}]
  local want_slots, give_slots = spec[p + @{lease_entry.want_slots}], spec[p + @{lease_entry.give_slots}]
  local until_us = spec[p + @{lease_entry.slots_until}]
  p = p + @{lease_entry}
  local raw = redis.call('HGET', KEYS[i], 's')
  local s
  if raw then
    s = {struct.unpack(fmt_of(D, #raw / 8), raw)}
    s[#s] = nil
    if s[4] ~= STATE_V then s = upgrade(s) end
  else
    s = {0, 0, 0, STATE_V}
  end
  local ttl = 0
  for b = 1, nb do
    local id, lim = spec[p + @{bucket.id}], spec[p + @{bucket.limit}]
    local q = p
    --@splice window_now
    p = q
    local want, give = spec[p + @{lease_bucket.want}], spec[p + @{lease_bucket.give}]
    p = p + @{lease_bucket}
    local k
    for j = FIRST_BUCKET, #s - 3, BUCKET_WIDTH do
      if s[j] == id then k = j break end
    end
    --@splice bucket_level
    if give > 0 then
      l = l + give
      if l > lim then l = lim end
    else
      l = l + give
    end
    local got = 0
    if want > 0 and l > 0 then
      got = want
      if l < got then got = l end
    end
    l = l - got
    s[k + 1], s[k + 2], s[k + 3] = l, now, lim
    grants[#grants + 1] = got
    local full
    if we > 0 then full = we - now
    else full = (lim - l) * (pd * 1e6) / lim end
    if full > ttl then ttl = full end
  end
  if clim >= 0 then
    local all = redis.call('HGETALL', KEYS[i])
    local total, mine, dead = 0, 0, {}
    for j = 1, #all, 2 do
      local f = all[j]
      if string.byte(f) == 99 then -- 'c'
        local count, exp = struct.unpack('<dd', all[j + 1])
        if exp <= now then
          dead[#dead + 1] = f
        elseif f == mine_field then
          mine = count
        else
          total = total + count
        end
      end
    end
    if #dead > 0 then redis.call('HDEL', KEYS[i], unpack(dead)) end
    mine = mine - give_slots
    if mine < 0 then mine = 0 end
    local room = clim - total - mine
    local got = want_slots
    if room < got then got = room end
    if got < 0 then got = 0 end
    mine = mine + got
    if mine > 0 then
      redis.call('HSET', KEYS[i], mine_field, struct.pack('<dd', mine, until_us))
    else
      redis.call('HDEL', KEYS[i], mine_field)
    end
    grants[#grants + 1] = mine
    grants[#grants + 1] = total + mine
    if until_us - now > ttl then ttl = until_us - now end
  end
  s = trim_foreign(s, nb, now)
  raws[i] = write_level(KEYS[i], s, ttl, D, D, now)
end

local mkey = KEYS[n + @[lease_keys.messages]]
local posts, deletes = tonumber(ARGV[@[lease_argv.posts]]), tonumber(ARGV[@[lease_argv.deletes]])
local a = @[lease_argv]
for _ = 1, posts do
  redis.call('HSET', mkey, ARGV[a], ARGV[a + 1] .. struct.pack('<d', now))
  a = a + 2
end
if posts > 0 then redis.call('PEXPIRE', mkey, ARGV[@[lease_argv.message_keep_ms]]) end
for _ = 1, deletes do
  if redis.call('HGET', mkey, ARGV[a]) == ARGV[a + 1] then redis.call('HDEL', mkey, ARGV[a]) end
  a = a + 2
end

local out = {now, struct.pack(fmt_of(D, #grants), unpack(grants))}
if #grants == 0 then out[2] = '' end
for i = 1, n do out[#out + 1] = raws[i] end
if ARGV[@[lease_argv.read]] == '1' then
  local keep_us = tonumber(ARGV[@[lease_argv.message_keep_ms]]) * 1000
  local msgs = redis.call('HGETALL', mkey)
  local stale = {}
  for j = 1, #msgs, 2 do
    local _, at = struct.unpack('<dd', msgs[j + 1])
    if at + keep_us < now then
      stale[#stale + 1] = msgs[j]
    else
      out[#out + 1] = msgs[j]
      out[#out + 1] = msgs[j + 1]
    end
  end
  if #stale > 0 then redis.call('HDEL', mkey, unpack(stale)) end
end
return out
