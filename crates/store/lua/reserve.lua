#!lua
--@prelude layout ledger state level alerts denied
-- reserve.lua: take one request, the prompt and output tokens and a concurrency
-- lease at every level, all or nothing. The Redis port of the one algorithm,
-- crates/core/src/budget/reserve.rs, held to it by tests/store/differential/; state layout
-- in crates/core/src/budget/state.rs. build.rs prepends the constants in capitals
-- (crates/core/src/layout.rs), clock_us(), lua/ledger.lua, lua/state.lua,
-- lua/level.lua, lua/alerts.lua and lua/denied.lua, and splices the rules of lua/splice/
-- (window_now, bucket_level, output_room, reservation_spend, bucket_crossings)
-- at their markers. Positions written by name are calls.rs's.
--
-- One chunk in three parts (read, check, write), not three local functions:
-- a function would reach the chunk's locals and the prelude's constants as
-- upvalues, one more VM instruction per use in the per-bucket loops, and
-- measured +10% Redis instructions per reserve (callgrind, issue 25) against
-- the 2% allowed.
--
-- KEYS[1..n]  level hashes, outermost first (only levels with a limit)
-- KEYS[n+1]   reservation record
-- KEYS[n+2]   idempotency entry (only when ARGV[4] ~= '0')
-- ARGV[1]  spec: little-endian doubles
--          n, prompt tokens, max output tokens, min output tokens, lease ttl (us),
--          estimated prompt tokens (0: the caller counted), headroom (the share
--          of every limit to leave, 0 <= headroom < 1), prompt_spend (the prompt
--          at the input price: tokens x uUSD per million), output_price (uUSD per
--          million), hret and dret (how long ledger rows are kept past their
--          hour and day, us; 0: no ledger), the learned output (0: none)
--          (calls.rs RESERVE), then the cost vector: a double per rate
--          dimension by its code (crates/core/src/dimension.rs), what a bucket of it
--          takes, the token, output and spend places left for each level's
--          held output (below), then per level:
--          bucket count b, concurrency limit (-1: none), reclaim weight w (what one
--          reclaimed lease adds to the packed count: 2^(13 k) for level k = 0
--          global, 1 tenant, 2 user, 3 session; 0 for a model group's slots at a level that
--          counts its own), the overrun credit's capacity and refill period (us;
--          capacity 0: the level holds the grant), the level's bit, the key's
--          longest life past this write (us: a session's session_ttl, else
--          MAX_TTL; its leases still outlive it), then b times: id, limit
--          (bucket id = group tag * 1e8 + dimension * 1e7 + period in seconds;
--          dimension the code of crates/core/src/dimension.rs, REQUESTS 1 ...; tag
--          0: all models); a calendar window's "period" is WINDOWS + its tag, and
--          three more doubles follow its limit: the window's start and end (us)
--          around the caller's time, and the end of the next. Its level does not
--          refill; a bucket stored before the window's start is full. A bucket
--          takes its dimension's place of the cost vector, the level's held output
--          in tokens (prompt + held), output and spend, and denies when it would keep less
--          than headroom * limit; a concurrency limit denies when n + 1 > limit -
--          headroom * limit.
--          Output tokens are granted as many as every token, output-token and
--          spend bucket can hold (lua/splice/output_room.lua), up to the max;
--          fewer than the min is a denial (min = max: all or nothing).
--          A level with a credit holds the learned output instead of the grant
--          (crates/core/src/output.rs) while its credit, refilled since it was
--          written (hash field 'o': credit, time), covers max - learned; it
--          takes grant - learned from the credit, and bounds the grant only
--          below the learned output.
-- ARGV[2]  lease field '#<nonce>'
-- ARGV[3]  record ttl (ms)   ARGV[4] idempotency ttl (ms, '0': none)
-- ARGV[5]  record tail: lease mask (1 byte), owner tag (8), fingerprint (8), amount 0.0 (8),
--          then the prompt's mix (REC_LEN_MIX - REC_LEN bytes) with the content-aware correction
-- ARGV[6]  the struct format of ARGV[1]
-- ARGV[7..6+n]  the struct format of each level's state as this call's buckets make it
--          (any other length, e.g. with buckets passing through, gets one built)
-- ARGV[7+n], ARGV[8+n], ARGV[9+n]  with the ledger on: the tenant's ledger key
--          prefix, the reservation's hourly and daily row fields (ledger.lua)
-- ARGV[#ARGV-1]  when some bucket has alert thresholds (after the ledger's, if any):
--          their spec (alerts.lua)
-- ARGV[#ARGV]  the tenant's record key prefix: a record key is it and a nonce
--          (for an idempotent replay, whose entry holds the nonce)
--
-- Level hash: field 's' = state, little-endian doubles: n (live leases), e (lower
-- bound of the earliest lease expiry, 0: none), x (the key's expiry, us), the
-- format STATE_V, then per bucket: id, level, time of level (us), the limit the
-- level was stored under (a state of the earlier format is upgraded as read:
-- state.lua). Fields '#<nonce>' = lease expiry (double).
-- Buckets this call does not know (another replica's configuration) pass through.
-- Record: 'R' | cost, lease expiry (doubles) | tail | estimated prompt tokens, granted
-- output, spend reserved in uUSD, when it entered the ledger (us, 0: it did not) (doubles)
-- | when a level holds the learned output: the bits of those levels (1 byte), the
-- learned output and its spend (doubles) | the prompt's mix, when ARGV[5] carries
-- one (copied, never read here).
-- With the ledger on, a reservation taken enters its tenant's hourly and daily rows
-- as one unsettled reservation with its tokens (settle.lua moves it).
--
-- Returns (the tags first: REPLY_ALLOWED 1, REPLY_DENIED 0, REPLY_REPLAYED 2,
-- REPLY_KEY_CONFLICT 3, REPLY_KEY_SPENT 4, from crates/core/src/layout.rs)
--   {1, now, granted output, state..., reserved output, [reclaimed]}  allowed; each level's
--                                                          state after taking the cost; the
--                                                          most output any level holds
--   {0, now, granted output, state..., mask, [reclaimed]}  denied; nothing changed; states as
--                                                          they were; mask: DENIED_DOUBLES doubles of 32 bits,
--                                                          bit i of the whole: check i denied
--   {2, now, 0, state..., nonce, cost, lease_left_ms, [reclaimed]}  idempotent replay; nothing taken
--   (a cluster's reply that queued an alert ends with 'A<now>': alerts.lua)
--   ([reclaimed], only when non-zero: the expired leases this call dropped — leases never
--   settled — per level, packed as the sum of count_k * 2^(13 k) (the weights above),
--   each count capped at 2^13 - 1; one optional integer: every reply value costs Redis CPU)
--   {3}                         idempotency key used before for another request
--   {4, state}                  idempotency key of a reservation already settled ('C' or
--                               'F') or whose lease lapsed ('R'): nothing to replay
-- A state is '' for a level never written (every bucket full). The caller
-- computes readings from the states with the same arithmetic.
--
-- Invariants: everything is read and checked before anything is written (only
-- expired leases are reclaimed early, which changes no outcome); a key's TTL
-- only grows and always outlives its state; time is Redis TIME, in microseconds.
-- Numbers travel as binary doubles: Lua never formats or parses decimals (but
-- for the ledger's hour and day in its key names).
-- A key's life is capped at 90 days however deep its debt; a state keeps at
-- most 16 buckets this call does not know (the most recently used).

local now = clock_us()
-- No format to slice from: one is built (fmt_of) only for a state of an unusual length.
local DOUBLES = ''
local spec = {struct.unpack(ARGV[@[reserve_argv.spec_format]], ARGV[@[reserve_argv.spec]])}
local nlev, prompt, max_out = spec[@[reserve.levels]], spec[@[reserve.prompt]], spec[@[reserve.max_output]]
local min_out, lease_ttl = spec[@[reserve.min_output]], spec[@[reserve.lease_ttl_us]]
local estimated, headroom = spec[@[reserve.estimated]], spec[@[reserve.headroom]]
local prompt_spend, output_price = spec[@[reserve.prompt_spend]], spec[@[reserve.output_price]]
local hret, dret = spec[@[reserve.hourly_retention_us]], spec[@[reserve.daily_retention_us]]
local learned = spec[@[reserve.learned_output]]
if learned <= 0 or learned >= max_out then learned = nil end
-- The cost vector: spec[C + code] is what a bucket of that dimension takes
-- (the token, output and spend places are each level's to fill).
local C = @[reserve] - 1
local FIRST = @[reserve] + DIMS
-- Alert thresholds: the place of the next bucket that has some (0: none),
-- its entry at alert_at.
local alert_spec, alert_at, alert_next = nil, 2, 0
do
  local at = @[reserve_argv] + nlev
  if hret > 0 then at = at + @{ledger_argv} end
  if #ARGV > at then
    alert_spec = {struct.unpack(fmt_of(DOUBLES, #ARGV[at] / 8), ARGV[at])}
    alert_spec[#alert_spec] = nil -- struct.unpack's last value is the next read position
    alert_next = alert_spec[2]
  end
end
local crossings = nil

-- An earlier reservation under the same idempotency key?
local replay
if ARGV[@[reserve_argv.idempotency_ttl_ms]] ~= '0' then
  local nonce = redis.call('GET', KEYS[nlev + @[reserve_keys.idempotency]])
  if nonce then
    local rec = redis.call('GET', ARGV[#ARGV] .. nonce)
    if rec then
      local fp = REC_FINGERPRINT - REC_MASK + 1 -- where the tail holds it
      if string.sub(rec, REC_FINGERPRINT, REC_FINGERPRINT + 7) ~= string.sub(ARGV[@[reserve_argv.record_tail]], fp, fp + 7) then
        return {REPLY_KEY_CONFLICT}
      end
      local c, ex = struct.unpack('<dd', rec, REC_COST)
      local st = string.sub(rec, 1, 1)
      if st ~= RESERVED or ex <= now then return {REPLY_KEY_SPENT, st} end
      local left = (ex - now) / 1000
      left = left + (-left) % 1
      if left < 0 then left = 0 end
      replay = {nonce, c, left}
    end
  end
end

-- Read: every level, each bucket's level now (put in its state, whose place
-- for it goes in `bucket_at`, in plan order), and the leases, reclaiming lapsed
-- ones once the earliest expiry has passed.
-- Tables sized by their constructors: growing one from {} reallocates at 1, 2,
-- 4 and 8 entries (measured: 5% of a reserve's Redis instructions, issue 27).
local raws, states, next_spec, ttls = {false, false, false, false}, {false, false, false}, {0, 0, 0}, {0, 0, 0}
local bucket_at = {0, 0, 0, 0, 0, 0, 0, 0}
local reclaimed = 0 -- packed: see the reply above
local room = max_out -- the output tokens every bucket can hold
local credits, lmask = nil, 0 -- per level holding the learned output: its credit now (a table only then)
local grant_held = false -- some level holds the grant in a bucket the output counts in
local p, seen = FIRST, 0 -- the level's spec; the buckets of earlier levels
for i = 1, nlev do
  local nb, clim = spec[p + @{reserve_level.buckets}], spec[p + @{reserve_level.concurrency}]
  local weight, cap = spec[p + @{reserve_level.reclaim_weight}], spec[p + @{reserve_level.overrun_capacity}]
  local raw, holds = nil, max_out
  if learned and cap > 0 then
    local r = redis.call('HMGET', KEYS[i], 's', 'o')
    raw = r[1]
    local c = cap
    if r[2] then
      local c0, t = struct.unpack('<dd', r[2])
      local el = now - t
      if el < 0 then el = 0 end
      c = c0 + el * cap / spec[p + @{reserve_level.overrun_refill_us}]
      if c > cap then c = cap end
    end
    if c >= max_out - learned then
      credits = credits or {}
      credits[i], holds, lmask = c, learned, lmask + spec[p + @{reserve_level.bit}]
    end
  else
    raw = redis.call('HGET', KEYS[i], 's')
  end
  local s
  local fmt = ARGV[@{reserve_argv} + i]
  if raw then
    if #raw ~= (#fmt - 1) * 8 then fmt = fmt_of(DOUBLES, #raw / 8) end
    s = {struct.unpack(fmt, raw)}
    s[#s] = nil -- struct.unpack's last value is the next read position
    if s[4] ~= STATE_V then s = upgrade(s) end
  else
    raw, s = '', {0, 0, 0, STATE_V}
  end
  local ns = #s
  local q = p + @{reserve_level}
  for b = 1, nb do
    local id, lim = spec[q + @{bucket.id}], spec[q + @{bucket.limit}]
    -- A calendar window: its start and end now (the next once a boundary passed).
    --@splice window_now
    local k = FIRST_BUCKET + (b - 1) * BUCKET_WIDTH
    if s[k] ~= id then
      k = nil
      for j = FIRST_BUCKET, ns - 3, BUCKET_WIDTH do
        if s[j] == id then k = j break end
      end
    end
    --@splice bucket_level
    local kind = (id % GROUP - pd) / DIM
    --@splice output_room
    -- Output counts in tokens, output and spend (Dimension::counts_output).
    -- (Only asked with a learned output: without one every level holds the grant.)
    if learned and holds == max_out and (kind == TOKENS or kind == OUTPUT or kind == SPEND) then
      grant_held = true
    end
    s[k + 1], bucket_at[seen + b] = l, k
  end
  next_spec[i] = q
  if clim >= 0 then
    local n, e = s[1], s[2]
    if e > 0 and now >= e then
      -- Reclaim expired leases: recount, find the earliest live expiry.
      local all = redis.call('HGETALL', KEYS[i])
      local dead
      n, e, dead = 0, 0, {}
      for j = 1, #all, 2 do
        if string.byte(all[j]) == 35 then -- '#'
          local x = struct.unpack('<d', all[j + 1])
          if x <= now then
            dead[#dead + 1] = all[j]
          else
            n = n + 1
            if e == 0 or x < e then e = x end
          end
        end
      end
      reclaimed = reclaimed + math.min(#dead, RECLAIM_CAP) * weight
      for j = 1, #dead, 1000 do
        redis.call('HDEL', KEYS[i], unpack(dead, j, math.min(j + 999, #dead)))
      end
      local old = {struct.unpack(fmt_of(DOUBLES, #raw / 8), raw)}
      old[#old] = nil
      old[1], old[2] = n, e
      raw = struct.pack(fmt_of(DOUBLES, #old), unpack(old))
      redis.call('HSET', KEYS[i], 's', raw)
      s[1], s[2] = n, e
    end
  end
  raws[i], states[i] = raw, s
  p = next_spec[i]
  seen = seen + nb
end

-- The output to grant: all of it, or as much as fits, but never below the min.
local grant = room - room % 1
if grant < min_out then grant = min_out end
-- The learned output and its spend, where levels hold it (less than the grant).
if learned and (learned >= grant or lmask == 0) then learned, lmask = nil, 0 end
local lspend = 0
if learned then
  local grant = learned
  --@splice reservation_spend
  lspend = spend
end
--@splice reservation_spend

-- The granted output and its spend in the cost vector, in the places of the
-- dimensions the output counts in (Dimension::counts_output; Cost::reservation).
spec[C + TOKENS], spec[C + OUTPUT], spec[C + SPEND] = prompt + grant, grant, spend

-- Check: every bucket and limit in plan order, taking the cost in the states
-- read, and how long each level's key must live.
-- The denied checks: 32 per double (a double holds 53 bits exactly); check i
-- is bit i % 32 of double w = floor(i / 32) + 1 (inline: a closure per call
-- costs its creation and upvalues even when nothing is denied), made at the
-- first denial.
local denied_mask, check_at = nil, 0
p, seen = FIRST, 0
for i = 1, nlev do
  local nb, clim, s, ttl = spec[p + @{reserve_level.buckets}], spec[p + @{reserve_level.concurrency}], states[i], 0
  -- A level holding the learned output takes it in the places of the
  -- dimensions the output counts in, the grant's put back after it.
  local holds_learned = learned and credits[i]
  if holds_learned then
    spec[C + TOKENS], spec[C + OUTPUT], spec[C + SPEND] = prompt + learned, learned, lspend
  end
  local q = p + @{reserve_level}
  for b = 1, nb do
    local id, lim = spec[q + @{bucket.id}], spec[q + @{bucket.limit}]
    --@splice window_now
    local c = spec[C + (id % GROUP - pd) / DIM]
    local k = bucket_at[seen + b]
    local l = s[k + 1]
    if l - c < headroom * lim then
      local w = (check_at - check_at % 32) / 32 + 1
      denied_mask = denied_mask or denied_words()
      denied_mask[w] = denied_mask[w] + 2 ^ (check_at % 32)
    end
    check_at = check_at + 1
    --@splice bucket_crossings
    l = l - c
    s[k + 1], s[k + 2], s[k + 3] = l, now, lim
    -- How long the key must live for this bucket: until full again, or
    -- until its window ends (it is full in the next).
    local full
    if we > 0 then full = we - now
    else full = (lim - l) * (pd * 1e6) / lim end
    if full > ttl then ttl = full end
  end
  if clim >= 0 then
    if s[1] + 1 > clim - headroom * clim then
      local w = (check_at - check_at % 32) / 32 + 1
      denied_mask = denied_mask or denied_words()
      denied_mask[w] = denied_mask[w] + 2 ^ (check_at % 32)
    end
    check_at = check_at + 1
  end
  if holds_learned then
    spec[C + TOKENS], spec[C + OUTPUT], spec[C + SPEND] = prompt + grant, grant, spend
  end
  if ttl > spec[p + @{reserve_level.max_life_us}] then ttl = spec[p + @{reserve_level.max_life_us}] end
  ttls[i] = ttl
  p = next_spec[i]
  seen = seen + nb
end

if replay or denied_mask then
  local out = {REPLY_DENIED, now, grant, unpack(raws, 1, nlev)}
  if replay then
    out[1], out[3] = REPLY_REPLAYED, 0
    out[#out + 1], out[#out + 2], out[#out + 3] = replay[1], replay[2], replay[3]
  else
    out[#out + 1] = struct.pack('<' .. string.rep('d', DENIED_DOUBLES), unpack(denied_mask, 1, DENIED_DOUBLES))
  end
  if reclaimed > 0 then out[#out + 1] = reclaimed end
  return out
end

-- Write: everything fits; every level and its lease, the record, the
-- ledger's rows and the idempotency entry.
local exp = now + lease_ttl
local expbin = struct.pack('<d', exp)
p = FIRST
for i = 1, nlev do
  local nb, clim, s, ttl = spec[p + @{reserve_level.buckets}], spec[p + @{reserve_level.concurrency}], states[i], ttls[i]
  local lease
  if clim >= 0 then
    s[1] = s[1] + 1
    if s[2] == 0 or exp < s[2] then s[2] = exp end
    if lease_ttl > ttl then ttl = lease_ttl end
    lease = expbin
  end
  s = trim_foreign(s, nb, now)
  local credit
  if learned and credits[i] then credit = struct.pack('<dd', credits[i] - (grant - learned), now) end
  raws[i] = write_level(KEYS[i], s, ttl, ARGV[@{reserve_argv} + i], DOUBLES, now, ARGV[@[reserve_argv.lease]], lease, credit)
  p = next_spec[i]
end
local learned_part, reserved = '', grant
if learned then
  learned_part = struct.pack('<Bdd', lmask, learned, lspend)
  -- Every level with buckets holds the learned output: that is all that is reserved.
  if not grant_held then reserved = learned end
end
local ledger_at = 0
if hret > 0 then ledger_at = now end
-- One pack: the state, cost and expiry, the tail's first 25 bytes (REC_ESTIMATED
-- - REC_MASK, asserted in layout.rs), the estimate, grant, spend and ledger time.
local tail = ARGV[@[reserve_argv.record_tail]]
local rec = struct.pack('<c1ddc25dddd', RESERVED, prompt + grant, exp, tail, estimated, grant, spend, ledger_at)
if learned or #tail > REC_ESTIMATED - REC_MASK then
  rec = rec .. learned_part .. string.sub(tail, REC_ESTIMATED - REC_MASK + 1)
end
redis.call('SET', KEYS[nlev + @[reserve_keys.record]], rec, 'PX', ARGV[@[reserve_argv.record_ttl_ms]])
if hret > 0 then
  local la = @{reserve_argv} + nlev
  ledger_add(ARGV[la + @[ledger_argv.prefix]], now, ARGV[la + @[ledger_argv.hour_field]],
    ARGV[la + @[ledger_argv.day_field]], {0, 0, 1, prompt + grant, 0, 0, 0, 0, 0, 0}, hret, dret, now)
end
if ARGV[@[reserve_argv.idempotency_ttl_ms]] ~= '0' then
  redis.call('SET', KEYS[nlev + @[reserve_keys.idempotency]], string.sub(ARGV[@[reserve_argv.lease]], 2), 'PX', ARGV[@[reserve_argv.idempotency_ttl_ms]])
end
local indexed = crossings and alerts_fire(KEYS, crossings, alert_spec[1], ARGV[#ARGV], now)
-- The reply's tail rides in raws (sized for it) so the reply is made at its size.
raws[nlev + 1] = reserved
local n = nlev + 1
if reclaimed > 0 then
  n = n + 1
  raws[n] = reclaimed
end
if indexed then
  n = n + 1
  raws[n] = indexed
end
return {REPLY_ALLOWED, now, grant, unpack(raws, 1, n)}
